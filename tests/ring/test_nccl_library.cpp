// NCCL opened on first use, never linked (src/ring/nccl_library.hpp; label ring, no GPU
// needed): nothing of NCCL is in the process before the first use; the first use takes the
// file handed over with set_nccl_library before the loader's own search, and names its
// version and file; a file handed over afterwards changes nothing. ctest runs each test in a
// process of its own; run together, the first one skips, saying why.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "ringattn/ringattn.hpp"

namespace ringattn {
namespace {

bool nccl_in_process() {
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);  // drops the reference RTLD_NOLOAD took
  return handle != nullptr;
}

TEST(NcclLibrary, OpensOnFirstUseTheFileHandedOverBeforeTheLoadersSearch) {
  if (nccl_in_process())
    GTEST_SKIP() << "SKIPPED: NCCL is already in this process (run this test alone, as ctest "
                    "does, to see the first use)";
  // A link to the NCCL the build found, under a name the loader's search cannot give: if
  // that is the file named afterwards, the handed-over path was tried first.
  std::string dir = (std::filesystem::temp_directory_path() / "ringattn-nccl-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string link = dir + "/libnccl.so.2";
#ifdef RINGATTN_TEST_NCCL_FILE
  ASSERT_EQ(symlink(RINGATTN_TEST_NCCL_FILE, link.c_str()), 0) << RINGATTN_TEST_NCCL_FILE;
#endif
  set_nccl_library(link);
  EXPECT_FALSE(nccl_in_process()) << "handing a path over must not open NCCL";
  const std::string v = nccl_version();
  std::printf("  %s\n", v.c_str());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(v.rfind("NCCL 2.", 0), 0u) << v;
#ifdef RINGATTN_TEST_NCCL_FILE
  EXPECT_NE(v.find(link), std::string::npos) << v;
  EXPECT_TRUE(nccl_in_process());
#else
  EXPECT_NE(v.find("SIMT emulator"), std::string::npos) << v;  // no file: the emulator's NCCL
#endif
}

TEST(NcclLibrary, AFileHandedOverOnceNcclIsOpenChangesNothing) {
  const std::string before = nccl_version();
  ASSERT_EQ(before.rfind("NCCL 2.", 0), 0u) << before;
  set_nccl_library("/nonexistent/libnccl.so.2");
  EXPECT_EQ(nccl_version(), before);
}

}  // namespace
}  // namespace ringattn
