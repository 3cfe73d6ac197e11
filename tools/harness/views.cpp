// STUB (owner: validation/layout helper)
#include "harness/views.hpp"
