#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace deepinfer {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "a special file";
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

int open_regular_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot open '{}': {}", path, std::strerror(errno));
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat '{}': {}", path, std::strerror(errno));
  DI_CHECK(S_ISREG(st.st_mode), "'{}' is {}; a regular file is needed", path, kind_of(st.st_mode));
  // Regular files never block; clear the flag so reads behave as usual.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  closer.fd = -1;
  return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  FdCloser closer{open_regular_file(path)};
  struct stat st {};
  if (::fstat(closer.fd, &st) != 0) fail("cannot stat '{}': {}", path, std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  DI_CHECK(size <= max_bytes, "'{}' is {} bytes; files of this kind are limited to {} bytes", path, size, max_bytes);
  std::string text(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(closer.fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read '{}': {}", path, std::strerror(errno));
    if (n == 0) break;  // the file shrank while being read
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace deepinfer
