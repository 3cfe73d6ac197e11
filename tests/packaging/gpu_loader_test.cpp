// The core's run-time loading of the GPU backend module (dispatch/gpu_loader.cpp): every way
// a load can fail becomes a reason naming the file and dlerror's text, never a crash, and the
// build's own module (CUDA builds) loads with both entry points the registry needs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dispatch/gpu_module.hpp"
#include "dispatch/registry.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::detail {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(GpuLoader, MissingFileNamesItAndDlerror) {
  const std::string path = ::testing::TempDir() + "no-such-dir/libstrideattn_gpu.so.0";
  const GpuModuleLoad l = load_gpu_module(path);
  EXPECT_EQ(l.module, nullptr);
  EXPECT_TRUE(contains(l.error, path)) << l.error;
  EXPECT_TRUE(contains(l.error, "could not be loaded")) << l.error;
  EXPECT_TRUE(contains(l.error, "No such file or directory")) << l.error;
}

TEST(GpuLoader, FileThatIsNoLibrary) {
  const std::string path = ::testing::TempDir() + "strideattn_not_a_library.so";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("not a shared object\n", f);
  std::fclose(f);
  const GpuModuleLoad l = load_gpu_module(path);
  std::remove(path.c_str());
  EXPECT_EQ(l.module, nullptr);
  EXPECT_TRUE(contains(l.error, path + " could not be loaded: ")) << l.error;
  // dlerror's own words follow (e.g. "invalid ELF header" or "file too short").
  EXPECT_GT(l.error.size(), (path + " could not be loaded: ").size() + 30) << l.error;
}

TEST(GpuLoader, LibraryWithoutTheEntryPoint) {
  const GpuModuleLoad l = load_gpu_module(STRIDEATTN_TEST_C_LIBRARY);
  EXPECT_EQ(l.module, nullptr);
  EXPECT_TRUE(contains(l.error, STRIDEATTN_TEST_C_LIBRARY)) << l.error;
  EXPECT_TRUE(contains(l.error, "has no entry point strideattn_gpu_module_v1")) << l.error;
}

TEST(GpuLoader, TheBuildsOwnModule) {
  const std::string module = STRIDEATTN_TEST_GPU_MODULE;
  const GpuModuleLoad& own = gpu_module();
  if (module.empty()) {
    // CPU-only build: no module, and the verdicts say the build has no CUDA.
    EXPECT_EQ(own.module, nullptr);
    EXPECT_TRUE(contains(own.error, "this build has no GPU module")) << own.error;
    EXPECT_FALSE(backend_compiled(Backend::cuda));
    EXPECT_FALSE(backend_compiled(Backend::cudnn));
    const std::string why = missing_backend_reason(Backend::cuda);
    EXPECT_TRUE(contains(why, "not part of this build (built without CUDA")) << why;
    return;
  }
  ASSERT_NE(own.module, nullptr) << own.error;
  EXPECT_NE(own.module->cuda, nullptr);
  EXPECT_EQ(own.module->cuda->id(), Backend::cuda);
  EXPECT_TRUE(backend_compiled(Backend::cuda));
  // The same file loaded by path is the same module (the loader does not load it twice).
  const GpuModuleLoad again = load_gpu_module(module);
  ASSERT_NE(again.module, nullptr) << again.error;
  EXPECT_EQ(again.module->cuda, own.module->cuda);
}

}  // namespace
}  // namespace strideattn::detail
