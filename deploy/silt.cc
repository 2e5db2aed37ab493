#include "deploy/cli.h"

int main(int argc, char** argv) { return silt::deploy::RunCli(argc, argv); }
