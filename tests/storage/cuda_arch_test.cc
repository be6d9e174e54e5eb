// Which GPUs the built kernels run on (storage/device/cuda/cuda_arch.h): the
// decision CudaBackend makes before its first launch, tested without a GPU.
#include "storage/device/cuda/cuda_arch.h"

#include <gtest/gtest.h>

namespace tierkv::storage {
namespace {

CudaArchitectures Parse(std::string_view list) {
  auto parsed = ParseCudaArchitectures(list);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : CudaArchitectures{};
}

TEST(CudaArchTest, TheDefaultBuildRunsOnAmpereAdaAndHopper) {
  const auto built = Parse("80-real;89-real;90-real");  // cmake/Cuda.cmake
  EXPECT_TRUE(KernelsRunOn(built, 8, 0));               // A100
  EXPECT_TRUE(KernelsRunOn(built, 8, 6));  // A10, RTX 30xx: sm_80 SASS
  EXPECT_TRUE(KernelsRunOn(built, 8, 9));  // L4, L40
  EXPECT_TRUE(KernelsRunOn(built, 9, 0));  // H100, H200
}

TEST(CudaArchTest, OlderAndNewerMajorVersionsAreRefused) {
  const auto built = Parse("80-real,89-real,90-real");
  EXPECT_FALSE(KernelsRunOn(built, 7, 5));   // T4
  EXPECT_FALSE(KernelsRunOn(built, 10, 0));  // B200: no sm_100 SASS, no PTX
  EXPECT_FALSE(KernelsRunOn(built, 12, 0));
}

TEST(CudaArchTest, SassDoesNotRunOnAnOlderMinorVersion) {
  EXPECT_FALSE(KernelsRunOn(Parse("89-real"), 8, 6));
  EXPECT_TRUE(KernelsRunOn(Parse("89-real"), 8, 9));
}

TEST(CudaArchTest, PtxRunsOnItsOwnAndNewerGpusOnly) {
  EXPECT_TRUE(KernelsRunOn(Parse("90"), 10, 0));  // a bare number: both
  EXPECT_TRUE(KernelsRunOn(Parse("90-virtual"), 12, 0));
  EXPECT_FALSE(KernelsRunOn(Parse("90-virtual"), 8, 9));
  EXPECT_TRUE(KernelsRunOn(Parse("90-virtual"), 9, 0));
}

TEST(CudaArchTest, OnlyNamedArchitecturesParse) {
  for (const char* bad : {"native", "all", "90a", "9", "90-fake", "x"}) {
    EXPECT_FALSE(ParseCudaArchitectures(bad).ok()) << bad;
  }
  const auto both = Parse("80-real,90");
  EXPECT_EQ(both.sass, (std::vector<int>{80, 90}));
  EXPECT_EQ(both.ptx, (std::vector<int>{90}));
}

TEST(CudaArchTest, DescriptionNamesEveryArchitecture) {
  EXPECT_EQ(DescribeArchitectures(Parse("80-real;89-real;90-real")),
            "sm_80, sm_89, sm_90");
  EXPECT_EQ(DescribeArchitectures(Parse("90")), "sm_90, PTX compute_90");
  EXPECT_EQ(DescribeArchitectures(CudaArchitectures{}), "no architecture");
}

}  // namespace
}  // namespace tierkv::storage
