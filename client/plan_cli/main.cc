// dfa-plan: the `dfa plan` subcommand as a standalone program (argv[0] stands for "plan").
#include "client/plan_cli/plan_command.h"

int main(int argc, char** argv) { return dfa::RunPlanCommand(argc, argv, "dfa-plan", "dfa-plan"); }
