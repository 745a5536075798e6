#pragma once
// Kept while the trainer's includes move to the shared contract.
#include "common/exit_codes.h"
