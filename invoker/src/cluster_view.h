// The nodes of the cluster as the gateway last described them (name, data
// port, CPU capacity and use): where this invoker's executor may send compute
// proclets. Thread-safe; readers get an immutable snapshot.
#ifndef SILT_INVOKER_CLUSTER_VIEW_H_
#define SILT_INVOKER_CLUSTER_VIEW_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace silt::invoker {

struct NodeLoad {
  std::string name;
  std::string data_address;
  uint32_t cores = 0;     // capacity
  double cpu_used = 0;    // cores busy, as last reported
  bool draining = false;  // take nothing new
  uint32_t tasks = 0;     // compute proclets running there
  // Over its CPU high-water mark (the gateway's rebalancer): no new shares
  // there while another node has CPU to spare.
  bool hot = false;
};

class ClusterView {
 public:
  using Nodes = std::vector<NodeLoad>;
  void Set(Nodes nodes);
  // The latest view (never null; empty before the gateway's first).
  std::shared_ptr<const Nodes> Get() const;

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const Nodes> nodes_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const Nodes>();
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_CLUSTER_VIEW_H_
