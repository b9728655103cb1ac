/* eval.h: `visc eval knn|linear|finetune`: the SSL benchmark's evaluations
 * of a weights file (ssl_eval.h). */
#ifndef VISC_CLI_EVAL_H
#define VISC_CLI_EVAL_H

/* argv holds the arguments after "eval"; returns the exit status (errors:
 * one "visc: ..." line on stderr and status 1). */
int visc_cmd_eval(int argc, char **argv);

#endif
