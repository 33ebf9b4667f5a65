// The finite-difference check the model components' tests share: every element of a tensor
// against the central difference of a scalar loss.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

namespace hpct::test {

// Central differences in fp32 with h = 1e-2 on a smooth function of O(10) values: truncation and
// rounding stay below 2e-3 relative; a wrong term is off by O(1). v is perturbed in place and
// restored; loss() recomputes the loss from it.
template <class Loss>
void expect_gradient(std::vector<float>& v, const std::vector<float>& grad, Loss loss, const char* what) {
  for (size_t i = 0; i < v.size(); ++i) {
    const float keep = v[i];
    const double h = 1e-2;
    v[i] = keep + float(h);
    const double up = loss();
    v[i] = keep - float(h);
    const double down = loss();
    v[i] = keep;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(grad[i], fd, 2e-3 * (1 + std::fabs(fd))) << what << "[" << i << "]";
  }
}

}  // namespace hpct::test
