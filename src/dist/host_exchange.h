// Byte strings between the ranks of a group, over a communicator of host
// memory (the Gloo control group): what commands exchange outside the steps,
// e.g. a data-parallel `generate` sharing its input file and collecting its
// ranks' outputs. Every rank of the group calls each function together.
#pragma once

#include <string>
#include <vector>

namespace deepinfer {

class Communicator;

// `text` of rank `root` onto every rank.
void broadcast_string(Communicator& comm, std::string& text, int root);
// Every rank's `mine`, in rank order, on every rank.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

}  // namespace deepinfer
