// libedit's readline-compatible line editor and history (BSD licence), for userstorectl's
// interactive `sql` mode. Debian: libedit-dev.
#include <stdio.h>
#include <editline/readline.h>
