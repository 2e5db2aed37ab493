// `silt image`: OCI images without a registry (/system/images): import an
// image archive (an OCI image layout or `docker save` output) into every
// node, list what the nodes hold, remove.
#ifndef SILT_DEPLOY_IMAGE_CMD_H_
#define SILT_DEPLOY_IMAGE_CMD_H_

#include <string>
#include <vector>

#include "async_cmd.h"  // Requester

namespace silt::deploy {

// Each returns the command's exit code; errors go to stderr.
int ImageImport(const Requester& send, const std::string& file, bool wait);
int ImageList(const Requester& send, const std::string& output);
int ImageRemove(const Requester& send, const std::vector<std::string>& names);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_IMAGE_CMD_H_
