// The `silt` command line.
#ifndef SILT_DEPLOY_CLI_H_
#define SILT_DEPLOY_CLI_H_

namespace silt::deploy {

// Runs one `silt` command; returns the process exit code.
int RunCli(int argc, char** argv);

}  // namespace silt::deploy

#endif  // SILT_DEPLOY_CLI_H_
