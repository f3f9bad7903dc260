/* version.c: clattn_version(). */
#include "clattn.h"

#define CLATTN_STR_(x) #x
#define CLATTN_STR(x) CLATTN_STR_(x)

const char *clattn_version(void)
{
    return CLATTN_STR(CLATTN_VERSION_MAJOR) "." CLATTN_STR(CLATTN_VERSION_MINOR) "." CLATTN_STR(CLATTN_VERSION_PATCH);
}
