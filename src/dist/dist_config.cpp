#include "dist/dist_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace deepinfer {
namespace {

// Far above any real job; keeps rank arithmetic (rank * chunk sizes) clear of overflow.
constexpr int kMaxWorldSize = 1 << 20;
constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600.0;

struct LauncherVars {
  std::string_view launcher;
  std::string_view rank, size, local_rank;
};

constexpr LauncherVars kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

int64_t parse_int(std::string_view name, std::string_view value) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, v);
  DI_CHECK(ec == std::errc() && ptr == end && !value.empty(), "{}='{}' is not an integer", name, value);
  return v;
}

std::optional<int64_t> int_var(const EnvLookup& env, std::string_view name) {
  std::optional<std::string> v = env(name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
}

uint16_t parse_port(std::string_view what, std::string_view value) {
  const int64_t port = parse_int(what, value);
  DI_CHECK(port >= 1 && port <= 65535, "{}='{}': a port is 1..65535", what, value);
  return static_cast<uint16_t>(port);
}

std::chrono::milliseconds parse_timeout(std::string_view value) {
  double seconds = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, seconds);
  DI_CHECK(ec == std::errc() && ptr == end && !value.empty(), "DEEPINFER_DIST_TIMEOUT_S='{}' is not a number",
           value);
  DI_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= kMaxTimeoutSeconds,
           "DEEPINFER_DIST_TIMEOUT_S='{}': seconds in (0, {}]", value, kMaxTimeoutSeconds);
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000.0)));
}

// Brackets a bare IPv6 address so that "host:port" stays unambiguous.
std::string host_port(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

}  // namespace

EnvLookup process_environment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

InitMethod parse_init_method(std::string_view s) {
  constexpr std::string_view kTcp = "tcp://", kFile = "file://";
  InitMethod m;
  if (s.starts_with(kFile)) {
    m.kind = InitMethod::Kind::File;
    m.path = std::string(s.substr(kFile.size()));
    DI_CHECK(m.path.size() > 1 && m.path.front() == '/',
             "init method '{}': file:// needs an absolute directory, e.g. file:///shared/rendezvous", s);
    return m;
  }
  DI_CHECK(s.starts_with(kTcp), "init method '{}': expected tcp://host:port or file:///dir", s);
  std::string_view rest = s.substr(kTcp.size());
  std::string_view host, port;
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    DI_CHECK(close != std::string_view::npos && close + 1 < rest.size() && rest[close + 1] == ':',
             "init method '{}': expected tcp://[ipv6-address]:port", s);
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    DI_CHECK(colon != std::string_view::npos, "init method '{}': expected tcp://host:port", s);
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    DI_CHECK(host.find(':') == std::string_view::npos,
             "init method '{}': write an IPv6 address in brackets, tcp://[addr]:port", s);
  }
  DI_CHECK(!host.empty(), "init method '{}': the host is empty", s);
  DI_CHECK(host.find_first_of("/?#@ ") == std::string_view::npos, "init method '{}': '{}' is not a host", s, host);
  m.host = std::string(host);
  m.port = parse_port(fmt::format("the port of init method '{}'", s), port);
  return m;
}

DistConfig dist_config_from_env(const EnvLookup& env) {
  DistConfig c;
  const LauncherVars* found = nullptr;
  for (const LauncherVars& l : kLaunchers) {
    const bool has_rank = env(l.rank).has_value(), has_size = env(l.size).has_value();
    if (!has_rank && !has_size) continue;
    DI_CHECK(has_rank && has_size, "{} is set but {} is not ({} launch)", has_rank ? l.rank : l.size,
             has_rank ? l.size : l.rank, l.launcher);
    found = &l;
    break;
  }
  if (found != nullptr) {
    const int64_t size = *int_var(env, found->size);
    DI_CHECK(size >= 1 && size <= kMaxWorldSize, "{}={}: the world size is 1..{}", found->size, size, kMaxWorldSize);
    const int64_t rank = *int_var(env, found->rank);
    DI_CHECK(rank >= 0 && rank < size, "{}={} is outside [0, {}) ({}={})", found->rank, rank, size, found->size,
             size);
    const int64_t local = int_var(env, found->local_rank).value_or(rank);
    DI_CHECK(local >= 0 && local < size, "{}={} is outside [0, {}) ({}={})", found->local_rank, local, size,
             found->size, size);
    c.world_size = static_cast<int>(size);
    c.rank = static_cast<int>(rank);
    c.local_rank = static_cast<int>(local);
  }

  if (std::optional<std::string> t = env("DEEPINFER_DIST_TIMEOUT_S")) c.timeout = parse_timeout(*t);
  if (std::optional<std::string> ifname = env("DEEPINFER_DIST_IFNAME")) {
    DI_CHECK(!ifname->empty() && ifname->size() < 16, "DEEPINFER_DIST_IFNAME='{}' is not an interface name",
             *ifname);
    c.ifname = *ifname;
  }

  const std::optional<std::string> addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  if (std::optional<std::string> init = env("DEEPINFER_DIST_INIT")) {
    parse_init_method(*init);
    c.init_method = *init;
  } else if (addr || port) {
    DI_CHECK(addr && !addr->empty(), "MASTER_PORT is set but MASTER_ADDR is not: the rendezvous needs both");
    DI_CHECK(port.has_value(), "MASTER_ADDR={} is set but MASTER_PORT is not: the rendezvous needs both", *addr);
    std::string_view host = *addr;
    if (host.starts_with('[') && host.ends_with(']')) host = host.substr(1, host.size() - 2);
    uint16_t rendezvous_port = parse_port("MASTER_PORT", *port);
    // torchrun's agent serves its own store on MASTER_PORT (and says so in
    // this variable): rank 0 serves ours on the next port.
    if (env("TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True")) {
      DI_CHECK(rendezvous_port < 65535, "MASTER_PORT=65535: under torchrun the rendezvous takes MASTER_PORT + 1");
      ++rendezvous_port;
    }
    c.init_method = "tcp://" + host_port(host, rendezvous_port);
    parse_init_method(c.init_method);
  } else if (c.world_size > 1) {
    fail("{} ranks and no rendezvous: set MASTER_ADDR and MASTER_PORT (rank 0's host and a free port), "
         "or DEEPINFER_DIST_INIT=tcp://host:port or file:///shared/dir",
         c.world_size);
  }
  return c;
}

}  // namespace deepinfer
