#include "testutil.h"
int main(void){tu_init("test_linear");CHECK(1,"x");return tu_finish();}
