#include "testutil.h"
int main(void){tu_init("test_large");CHECK(1,"x");return tu_finish();}
