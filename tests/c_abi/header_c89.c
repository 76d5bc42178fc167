/* cuflash_c.h must compile as strict ISO C89 (stdint.h aside, which every C99 libc has). */
#include "cuflash/cuflash_c.h"

int cuflash_header_c89_check(void) { return (int)sizeof(cuflash_forward_args) + CUFLASH_OK; }
