// Stands for the CUDA toolkit header of this name in the CPU emulation (emulation.h).
#pragma once
#include "emulation.h"
