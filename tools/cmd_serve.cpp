// `deepinfer serve`: the OpenAI- and Anthropic-compatible HTTP server. The
// model loads on the engine thread while the server already listens (/ready
// answers 503 until it is loaded). SIGTERM/SIGINT stop accepting connections,
// let requests in flight finish for up to --shutdown-timeout, abort the rest
// and exit 0.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/async_engine.h"
#include "engine_flags.h"
#include "serve_data_parallel.h"
#include "router/etcd.h"
#include "server/api_server.h"
#include "server/http_server.h"

namespace deepinfer::cli {
namespace {

// Each streaming client holds a descriptor; lift the soft limit to the hard one.
void raise_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

std::string default_served_name(const std::string& model_path) {
  std::filesystem::path p(model_path);
  if (p.has_filename() && p.extension() == ".gguf") return p.stem().string();
  return p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
}

// The host part of the URL other machines reach this engine at.
std::string advertised_host(const std::string& listen_host) {
  if (listen_host != "0.0.0.0" && listen_host != "::" && !listen_host.empty()) return listen_host;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') return name;
  return "127.0.0.1";
}

int run_serve(int argc, char** argv) {
  CLI::App app{"Serve a model over HTTP with OpenAI- and Anthropic-compatible APIs."};
  app.name("deepinfer serve");
  EngineFlags ef;
  add_engine_flags(app, ef);
  server::HttpServerOptions http;
  server::ApiServerOptions api;
  AsyncEngineOptions async;
  double shutdown_timeout = 30;
  int io_threads = 2;
  app.add_option("--host", http.host, "address to listen on");
  app.add_option("--port", http.port, "port to listen on (0 = any free port)");
  app.add_option("--api-key", api.api_key, "require this key (Authorization: Bearer, or x-api-key)");
  app.add_option("--served-model-name", api.served_model_name, "model name in the API (default: the model file's name)");
  app.add_option("--max-waiting", async.max_waiting, "requests queued beyond --max-num-seqs before 429")
      ->check(CLI::Range(size_t{0}, size_t{1} << 20));
  app.add_option("--shutdown-timeout", shutdown_timeout, "seconds to drain requests on SIGTERM")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--io-threads", io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  app.add_option("--request-workers", api.request_workers,
                 "threads that parse, validate and tokenise requests (off the I/O threads)")
      ->check(CLI::Range(1, 256));
  app.add_option("--max-queued-requests", api.max_queued_requests, "requests waiting for a request worker before 503")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--max-body-bytes", http.body_limit, "largest request body (413 beyond)")
      ->check(CLI::Range(uint64_t{1024}, uint64_t{1} << 30));
  app.add_option("--request-timeout", http.read_timeout_s, "seconds to receive a whole request")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--keep-alive-timeout", http.keep_alive_timeout_s, "seconds an idle connection is kept")
      ->check(CLI::Range(0.1, 3600.0));
  std::string role = "both";
  app.add_option("--role", role,
                 "both: whole requests; prefill: compute prompts' KV, hand it over (--kv-transport) and answer one "
                 "token; decode: continue requests from the KV handed over (docs/router.md)")
      ->check(CLI::IsMember({"both", "prefill", "decode"}));
  std::string kv_transport = "directory";
  app.add_option("--kv-transport", kv_transport,
                 "how KV moves from prefill to decode engines: directory (block files in the shared --kv-cache-dir; "
                 "across nodes a shared file system), shared (one node: the prefill engine's shared pool, device "
                 "memory over CUDA IPC, or shared host memory on the CPU) or ucx (across nodes: the decode engine "
                 "fetches from the prefill engine's host memory over UCX, RDMA where the fabric has it)")
      ->check(CLI::IsMember({"directory", "shared", "ucx"}));
  double kv_transport_gib = 4;
  app.add_option("--kv-transport-size", kv_transport_gib,
                 "with --kv-transport shared (prefill role) or ucx (both roles): GiB of host memory (device memory "
                 "for a shared pool on a GPU) that finished requests' KV waits in for its decode engine, or that "
                 "fetched KV lands in (least recently used reused first)")
      ->check(CLI::Range(0.001, 1024.0));
  std::string kv_transport_address = "0.0.0.0:0";
  app.add_option("--kv-transport-address", kv_transport_address,
                 "prefill role with --kv-transport ucx: HOST:PORT to serve KV on (port 0: any free port); decode "
                 "engines learn it from each answer (the machine's name when listening on every address)");
  std::vector<std::string> kv_transport_peers = {"127.0.0.1", "::1", "localhost"};
  app.add_option("--kv-transport-peers", kv_transport_peers,
                 "decode role with --kv-transport ucx: hosts (as the prefill engines name themselves) this engine "
                 "fetches KV from; fetched blocks serve every request's prefix cache, so list trusted hosts only")
      ->delimiter(',');
  std::string etcd, advertise_url;
  app.add_option("--etcd", etcd,
                 "register this engine in etcd (http://host:2379) for `deepinfer router --etcd` to find (with "
                 "--data-parallel-size, rank 0 registers the group's router once it listens)");
  app.add_option("--advertise-url", advertise_url,
                 "with --etcd: the URL routers reach this engine at (default http://HOST:PORT, the machine's "
                 "name when listening on every address)");
  double kv_export_timeout = 10;
  app.add_option("--kv-export-timeout", kv_export_timeout,
                 "prefill role: seconds to wait for a request's KV to be handed over before answering")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--max-n", api.limits.max_n, "largest n (samples per prompt)")->check(CLI::Range(1, SamplingParams::kMaxN));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  http.io_threads = io_threads;
  EngineConfig config = finish_engine_flags(ef, argv[0]);
  api.role = server::parse_serve_role(role).value_or(server::ServeRole::Both);  // checked by IsMember
  api.kv_export_timeout = std::chrono::milliseconds(static_cast<int64_t>(kv_export_timeout * 1000));
  if (kv_transport != "directory" && api.role == server::ServeRole::Both) {
    log_warn("serve: --kv-transport {} moves KV between --role prefill and --role decode engines; "
             "with --role both it does nothing", kv_transport);
  }
  if (kv_transport == "shared") {
    // The prefill engine's tier below the device is the pool decode engines read.
    if (api.role == server::ServeRole::Prefill) {
      config.kv_shared_pool_bytes = static_cast<uint64_t>(kv_transport_gib * 1073741824.0);
    }
    if (api.role == server::ServeRole::Decode) config.kv_import_shared = true;
  } else if (kv_transport == "ucx") {
    // Both sides keep the KV in a host tier: the prefill engine serves from
    // it, the decode engine fetches into it.
    if (api.role != server::ServeRole::Both) {
      config.kv_offloading_bytes =
          std::max(config.kv_offloading_bytes, static_cast<uint64_t>(kv_transport_gib * 1073741824.0));
    }
    if (api.role == server::ServeRole::Prefill) {
      config.kv_transport_listen = kv_transport_address;
      const size_t colon = kv_transport_address.rfind(':');
      std::string listen_host = colon == std::string::npos ? kv_transport_address : kv_transport_address.substr(0, colon);
      if (listen_host.size() >= 2 && listen_host.front() == '[' && listen_host.back() == ']') {
        listen_host = listen_host.substr(1, listen_host.size() - 2);  // [v6 address]
      }
      config.kv_transport_advertise_host = advertised_host(listen_host);
    }
    if (api.role == server::ServeRole::Decode) {
      config.kv_transport_fetch = true;
      config.kv_transport_peers = kv_transport_peers;
    }
  } else if (api.role != server::ServeRole::Both && config.kv_cache_dir.empty()) {
    // The KV moves between the two roles through the shared block directory.
    log_error("serve: --role {} needs --kv-cache-dir (a directory the prefill and decode engines share; on one node "
              "a tmpfs such as /dev/shm/...) or --kv-transport shared", role);
    return 2;
  }
  if (api.served_model_name.empty()) api.served_model_name = default_served_name(config.model_path);
  raise_file_limit();

  // Signals are taken synchronously by this thread; every thread started below inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Data parallelism: each rank's engine serves on a free port of its own,
  // behind rank 0's router on the public one.
  const bool data_parallel = config.data_parallel_size > 1;
  std::unique_ptr<DataParallelFront> front;
  server::HttpServerOptions own_http = http;
  if (data_parallel) {
    own_http.port = 0;
    config.data_parallel_independent_replicas = true;
    front = std::make_unique<DataParallelFront>(http, advertised_host(http.host), api.api_key, config.dist.timeout);
    async.on_loaded = [f = front.get()](Engine& e) { f->exchange(e); };
  }
  const auto load_start = std::chrono::steady_clock::now();
  AsyncEngine engine(config, async);
  server::ApiServer api_server(engine, api);
  server::HttpServer server(own_http, [&api_server](server::HttpRequest&& r, std::shared_ptr<server::ResponseChannel> ch) {
    api_server.handle(std::move(r), std::move(ch));
  });
  server.start();
  if (front) front->own_port_known(server.port());
  log_info("serve: listening on http://{}:{} (model '{}' loading)", own_http.host, server.port(), api.served_model_name);
  // --etcd: one record per engine that routers should send to. A
  // data-parallel group is one such engine, its rank 0's router on the public
  // port: rank 0 registers it once the router listens, the other ranks never.
  std::unique_ptr<router::EtcdRegistration> registration;
  const auto register_in_etcd = [&](int port) {
    const std::string url = !advertise_url.empty() ? advertise_url
                                                   : fmt::format("http://{}:{}", advertised_host(http.host), port);
    const nlohmann::json record = {{"url", router::parse_url(url).str()},
                                   {"role", server::serve_role_name(api.role)},
                                   {"model", api.served_model_name}};
    registration = std::make_unique<router::EtcdRegistration>(router::parse_url(etcd), router::parse_url(url).str(),
                                                              record.dump());
  };
  if (!etcd.empty()) {
    try {
      if (data_parallel) {  // registered later: check the URLs now
        router::parse_url(etcd);
        if (!advertise_url.empty()) router::parse_url(advertise_url);
      } else {
        register_in_etcd(server.port());
      }
    } catch (const Error& e) {
      log_error("serve: --etcd/--advertise-url: {}", e.what());
      server.stop();
      return 2;
    }
  }

  bool announced = false;
  for (;;) {
    timespec wait{0, 200'000'000};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) {
      log_info("serve: {} received; no new connections, draining for up to {} s", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               shutdown_timeout);
      break;
    }
    if (!announced && engine.ready()) {
      announced = true;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
      log_info("serve: model loaded in {:.2f} s; ready (max-model-len {}, max-num-seqs {}, max-waiting {})", secs,
               engine.engine()->max_model_len(), config.max_num_seqs, async.max_waiting);
    }
    // A group that steps together stops as one: another rank leaving (its own
    // SIGTERM) stops this one too, and all leave after the same vote.
    if (data_parallel && config.enable_expert_parallel && engine.group_leaving()) {
      log_info("serve: another rank of the data-parallel group is stopping; stopping too, draining for up to {} s",
               shutdown_timeout);
      break;
    }
    // A rank whose group steps together cannot serve without it: a lost peer ends it.
    if (engine.dead() && (engine.engine() == nullptr || (data_parallel && config.enable_expert_parallel))) {
      log_error("serve: {}", engine.error());
      server.stop();
      return 1;
    }
    if (front && config.dist.rank == 0) {
      try {
        if (front->start_router_when_ready() && !etcd.empty() && !registration) register_in_etcd(front->public_port());
      } catch (const Error& e) {
        log_error("serve: the data-parallel router: {}", e.what());
        server.stop();
        return 1;
      }
    }
  }
  registration.reset();  // routers stop sending new requests here first
  // Rank 0's router first: the requests it proxies finish on every rank,
  // whose engines keep stepping together meanwhile.
  if (front) front->stop(std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout * 1000)));
  server.stop_accepting();
  const size_t aborted = engine.drain(std::chrono::duration<double>(shutdown_timeout));
  // Let the last responses reach their clients.
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.active_responses() > 0 && std::chrono::steady_clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server.stop();
  log_info("serve: stopped ({} request(s) aborted at shutdown)", aborted);
  return 0;
}

}  // namespace

DEEPINFER_COMMAND("serve", "serve a model over HTTP (OpenAI- and Anthropic-compatible APIs)", run_serve);

}  // namespace deepinfer::cli
