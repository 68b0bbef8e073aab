// A main() for fuzz targets built without libFuzzer (gcc builds): runs
// LLVMFuzzerTestOneInput on each file named on the command line, or on every
// file inside each named folder, so corpora and crash reproducers can be replayed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) {
          run_file(e.path());
          ++n;
        }
      }
    } else {
      run_file(p);
      ++n;
    }
  }
  std::printf("replayed %zu inputs\n", n);
  return 0;
}
