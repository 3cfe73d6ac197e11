// STUB (owner: reference helper)
#include "harness/compare.hpp"
