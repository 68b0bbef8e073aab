#include "loader/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"

namespace deepinfer {

namespace {
// Closes the descriptor on every exit path; the mapping stays valid after close.
struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};
}  // namespace

MappedFile MappedFile::open(const std::string& path) {
  const int fd = open_regular_file(path);
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat '{}': {}", path, std::strerror(errno));
  DI_CHECK(st.st_size > 0, "'{}' is empty", path);
  auto size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail("cannot map '{}' ({} bytes): {}", path, size, std::strerror(errno));
  MappedFile f;
  f.data_ = static_cast<const uint8_t*>(p);
  f.size_ = size;
  f.path_ = path;
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace deepinfer
