// DistConfig from launcher variables, given as fake environments.
#include "dist/dist_config.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace deepinfer {
namespace {

using Env = std::map<std::string, std::string, std::less<>>;

DistConfig from(const Env& env) {
  return dist_config_from_env([&](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// The message of the Error that building the config throws ("" if none).
std::string error_of(const Env& env) {
  try {
    from(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DistConfig, NoVariablesIsOneRank) {
  const DistConfig c = from({});
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.local_rank, 0);
  EXPECT_EQ(c.init_method, "");
  EXPECT_EQ(c.timeout, std::chrono::seconds(300));
  EXPECT_EQ(c.ifname, "");
}

TEST(DistConfig, Torchrun) {
  const DistConfig c = from({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"},
                             {"MASTER_PORT", "29500"}});
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.init_method, "tcp://node0:29500");
}

TEST(DistConfig, UnderTorchrunsAgentStoreTheRendezvousTakesTheNextPort) {
  const Env env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"},
                {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_EQ(from(env).init_method, "tcp://node0:29501");
  Env at_the_top = env;
  at_the_top["MASTER_PORT"] = "65535";
  EXPECT_NE(error_of(at_the_top).find("MASTER_PORT + 1"), std::string::npos);
  Env explicit_init = env;
  explicit_init["DEEPINFER_DIST_INIT"] = "tcp://node0:40000";
  EXPECT_EQ(from(explicit_init).init_method, "tcp://node0:40000");
}

TEST(DistConfig, Mpirun) {
  const DistConfig c =
      from({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
            {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.local_rank, 3);
  EXPECT_EQ(c.init_method, "tcp://10.0.0.7:1234");
}

TEST(DistConfig, SlurmWithAFileRendezvous) {
  const DistConfig c = from({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "2"},
                             {"DEEPINFER_DIST_INIT", "file:///shared/job42"}});
  EXPECT_EQ(c.rank, 6);
  EXPECT_EQ(c.world_size, 16);
  EXPECT_EQ(c.local_rank, 2);
  EXPECT_EQ(c.init_method, "file:///shared/job42");
}

TEST(DistConfig, TorchrunInsideSlurmWins) {
  const DistConfig c = from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                             {"SLURM_NTASKS", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "2"}});
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 2);
}

TEST(DistConfig, MissingLocalRankIsTheRank) {
  const DistConfig c = from({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}});
  EXPECT_EQ(c.local_rank, 2);
}

TEST(DistConfig, InitOverridesMasterAddrAndTimeoutAndInterface) {
  const DistConfig c =
      from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "ignored"}, {"MASTER_PORT", "1"},
            {"DEEPINFER_DIST_INIT", "tcp://[fe80::1]:4000"}, {"DEEPINFER_DIST_TIMEOUT_S", "1.5"},
            {"DEEPINFER_DIST_IFNAME", "eth1"}});
  EXPECT_EQ(c.init_method, "tcp://[fe80::1]:4000");
  EXPECT_EQ(c.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.ifname, "eth1");
}

TEST(DistConfig, Ipv6MasterAddrIsBracketed) {
  EXPECT_EQ(from({{"MASTER_ADDR", "::1"}, {"MASTER_PORT", "80"}}).init_method, "tcp://[::1]:80");
  EXPECT_EQ(from({{"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "80"}}).init_method, "tcp://[::1]:80");
}

TEST(DistConfig, BadValuesNameTheVariable) {
  const Env rendezvous{{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  auto with = [&](Env extra) {
    for (const auto& [k, v] : rendezvous) extra.emplace(k, v);
    return error_of(extra);
  };
  EXPECT_NE(with({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is outside [0, 2)"), std::string::npos);
  EXPECT_NE(with({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}).find("RANK=-1"), std::string::npos);
  EXPECT_NE(with({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x' is not an integer"), std::string::npos);
  EXPECT_NE(with({{"RANK", "1 "}, {"WORLD_SIZE", "2"}}).find("not an integer"), std::string::npos);
  EXPECT_NE(with({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0"), std::string::npos);
  EXPECT_NE(with({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(with({{"RANK", "0"}}).find("WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(with({{"WORLD_SIZE", "2"}}).find("RANK is not"), std::string::npos);
  EXPECT_NE(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}).find("LOCAL_RANK=2"), std::string::npos);
  EXPECT_NE(with({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}).find("OMPI_COMM_WORLD_RANK=4"),
            std::string::npos);
  EXPECT_NE(with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "two"}}).find("SLURM_NTASKS='two'"), std::string::npos);
  EXPECT_NE(with({{"DEEPINFER_DIST_TIMEOUT_S", "0"}}).find("DEEPINFER_DIST_TIMEOUT_S"), std::string::npos);
  EXPECT_NE(with({{"DEEPINFER_DIST_TIMEOUT_S", "nan"}}).find("DEEPINFER_DIST_TIMEOUT_S"), std::string::npos);
  EXPECT_NE(with({{"DEEPINFER_DIST_TIMEOUT_S", "5s"}}).find("not a number"), std::string::npos);
  EXPECT_NE(with({{"DEEPINFER_DIST_IFNAME", ""}}).find("DEEPINFER_DIST_IFNAME"), std::string::npos);

  EXPECT_NE(error_of({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}).find("a port is 1..65535"),
            std::string::npos);
  EXPECT_NE(error_of({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}}).find("MASTER_PORT"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_ADDR", "h"}}).find("MASTER_PORT is not"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "1"}}).find("MASTER_ADDR is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("no rendezvous"), std::string::npos);
  // Malformed even for one rank: the variable was set, so it was meant.
  EXPECT_NE(error_of({{"DEEPINFER_DIST_INIT", "env://"}}).find("expected tcp://host:port or file:///dir"),
            std::string::npos);
}

TEST(DistConfig, ParseInitMethod) {
  const InitMethod tcp = parse_init_method("tcp://head-node.cluster:29500");
  EXPECT_EQ(tcp.kind, InitMethod::Kind::Tcp);
  EXPECT_EQ(tcp.host, "head-node.cluster");
  EXPECT_EQ(tcp.port, 29500);
  const InitMethod v6 = parse_init_method("tcp://[::1]:7");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 7);
  const InitMethod file = parse_init_method("file:///mnt/shared/rdzv");
  EXPECT_EQ(file.kind, InitMethod::Kind::File);
  EXPECT_EQ(file.path, "/mnt/shared/rdzv");

  for (const char* bad : {"", "tcp://", "tcp://host", "tcp://:80", "tcp://host:", "tcp://host:0", "tcp://host:65536",
                          "tcp://host:8x", "tcp://::1:80", "tcp://[::1]80", "tcp://[::1", "tcp://a/b:80",
                          "file://", "file://relative/dir", "file:///", "http://h:1"}) {
    EXPECT_THROW(parse_init_method(bad), Error) << bad;
  }
}

}  // namespace
}  // namespace deepinfer
