// The tests' precompiled header: the libraries' one plus GoogleTest and GoogleMock.
#pragma once

#include "pch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
