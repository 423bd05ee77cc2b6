#include "testutil.h"
int main(void){tu_init("test_quant");CHECK(1,"x");return tu_finish();}
