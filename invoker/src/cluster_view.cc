#include "cluster_view.h"

#include <utility>

namespace silt::invoker {

void ClusterView::Set(Nodes nodes) {
  auto next = std::make_shared<const Nodes>(std::move(nodes));
  absl::MutexLock l(&mu_);
  nodes_ = std::move(next);
}

std::shared_ptr<const ClusterView::Nodes> ClusterView::Get() const {
  absl::MutexLock l(&mu_);
  return nodes_;
}

}  // namespace silt::invoker
