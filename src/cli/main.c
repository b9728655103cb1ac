/* main.c: the visc program (placeholder entry until the trainer lands). */
#include <stdio.h>
int main(void) { return 0; }
