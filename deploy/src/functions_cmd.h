// The OpenFaaS-compatible commands (faas-cli's): login, logout, version,
// list, describe, deploy, remove, secrets; and Silt's snapshot commands.
#ifndef SILT_DEPLOY_FUNCTIONS_CMD_H_
#define SILT_DEPLOY_FUNCTIONS_CMD_H_

#include <string>
#include <vector>

#include "cli_common.h"
#include "deploy/stack.h"

namespace silt::deploy {

void Login(const std::string& gateway_flag, const std::string& user,
           std::string password, bool password_stdin);
void Logout(const std::string& gateway_flag);
void Version(const std::string& gateway_flag, const std::string& token,
             bool short_version);

void List(const Client& c, const std::string& ns, bool verbose,
          const std::string& output);
void Describe(const Client& c, const std::string& name, const std::string& ns);
bool RemoveOne(const Client& c, const std::string& name, const std::string& ns);
bool DeployOne(const Client& c, const StackFunction& f, bool replace,
               bool update);

// silt deploy's flags.
struct DeployArgs {
  bool replace = false, update = true, envsubst = true, no_snapshot = false;
  std::string stack_file, image, name, fprocess, filter;
  std::vector<std::string> env, labels, annotations, secrets, constraints;
};
// Deploys the stack file's functions (or --image/--name), the flags applied
// over the stack file's settings; 1 when any failed.
int Deploy(const GatewayFlags& g, const std::string& ns, DeployArgs& a);

void SnapshotList(const Client& c, const std::string& ns,
                  const std::string& name, bool as_json);
void SnapshotDelete(const Client& c, const std::string& ns,
                    const std::string& name);

// silt secret's flags.
struct SecretArgs {
  std::string name, literal, from_file;
  bool replace = false;
};

void SecretList(const Client& client, const std::string& ns);
void SecretRemove(const Client& client, const std::string& ns,
                  const std::string& name);
// Creates (or, `update`, updates) a secret; `literal_set`: --from-literal
// was given (even empty).
void SecretPut(const Client& client, const std::string& ns, const SecretArgs& a,
               bool update, bool literal_set);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_FUNCTIONS_CMD_H_
