// Does the order of send and recv decide whether a pairwise exchange over gloo's TCP
// transport runs at full duplex?  Gloo alone (no JAX, no XLA), for an upstream report.
//
// Each process is one rank; ranks j and j^1 are a pair. For every size it times, per
// call, the slowest rank's time (process 0 collects them) of:
//   send_first  each rank posts send(to peer) then recv(from peer): the order XLA's
//               GlooCommunicator::CollectivePermute uses for a ppermute;
//   recv_first  recv(from peer) then send(to peer): the order proposed as the fix;
//   shift       send to j+1, recv from j-1 (p >= 3): every link busy one way per pair
//               of hosts, the reference a full-duplex exchange should match;
//   one_way     even ranks send to j^1, odd ranks receive: half the bytes on the wire;
//   hd_send_first, hd_recv_first (p a power of two): halving-doubling's exchanges without
//               its arithmetic, n/2, n/4, ... with j^1, j^2, ..., then back, each step
//               waited for as a ppermute is, in either order;
//   ring, bidir_send_first, bidir_recv_first (only with --patterns): the ring's 2(p-1)
//               shifts of n/p, and the bidirectional ring's as XLA:CPU runs them (each
//               step's two lanes in turn, n/2p to j+1 then n/2p to j-1), in either order.
// --patterns A,B,... times only those (default: every pattern above the last line).
// with a barrier before every call (--barrier, the default: the ranks start within a
// barrier's skew) or without one (--no-barrier: each call starts when the last ended,
// as in a compiled JAX program); --skew-ms S delays the odd ranks by S ms after the
// barrier, so one peer of each pair is late by a known time, as on a loaded host.
//
// Built by build.sh against gloo's sources; run one process per host, e.g. on the
// emulated cluster of allreduce-jax (root or rootless):
//   allreduce-jax cluster --hosts 4 --link 200Mbit --
//       experiments/gloo_pair_order/exchange --store DIR --sizes 1MiB,16MiB  (one line)
// DIR: an empty folder every rank can read and write (gloo's FileStore rendezvous).
// Rank and world size come from ALLREDUCE_JAX_PROCESS_ID / _NUM_PROCESSES (or
// JAX_PROCESS_ID / JAX_NUM_PROCESSES); each rank listens on the address its host name
// resolves to (as XLA's gloo does). Rows (JSON, one per size and pattern) go to stdout
// of rank 0 and, with --out FILE, are appended there.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gloo/barrier.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::cerr << "exchange: " << what << std::endl;
  std::exit(2);
}

int EnvInt(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) v = std::getenv(fallback);
  if (v == nullptr) Fail(std::string(name) + " (or " + fallback + ") is not set");
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) Fail(std::string(name) + "=" + v + " is not a whole number");
  return static_cast<int>(x);
}

// "256KiB,1MiB" -> bytes.
std::vector<size_t> ParseSizes(const std::string& text) {
  std::vector<size_t> out;
  std::stringstream in(text);
  std::string word;
  while (std::getline(in, word, ',')) {
    size_t unit = 0;
    if (word.size() > 3 && word.compare(word.size() - 3, 3, "KiB") == 0) unit = 1 << 10;
    if (word.size() > 3 && word.compare(word.size() - 3, 3, "MiB") == 0) unit = 1 << 20;
    std::string digits = word.substr(0, word.size() - 3);
    if (unit == 0 || digits.empty() ||
        digits.find_first_not_of("0123456789") != std::string::npos || std::stoul(digits) == 0) {
      Fail("--sizes: '" + word + "' is not a whole number of KiB or MiB (e.g. 256KiB)");
    }
    out.push_back(std::stoul(digits) * unit);
  }
  if (out.empty()) Fail("--sizes: no sizes given");
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

struct Step {
  int send_to;    // -1: none
  int recv_from;  // -1: none
  size_t nbytes;  // from offset 0 of the buffers
};

struct Pattern {
  std::string name;
  bool recv_first;
  std::vector<Step> steps;  // in turn, each waited for (one ppermute each)
};

// Halving-doubling's exchanges without its arithmetic: n/2, n/4, ... with partners
// j^1, j^2, ... (reduce-scatter), then the same in reverse (all-gather).
std::vector<Step> HalvingDoubling(int rank, int size, size_t n) {
  std::vector<Step> down, up;
  for (int d = 1; d < size; d *= 2) {
    n /= 2;
    down.push_back({rank ^ d, rank ^ d, n});
  }
  up.assign(down.rbegin(), down.rend());
  down.insert(down.end(), up.begin(), up.end());
  return down;
}

// The ring's steps (2(p-1) shifts of n/p to j+1), or the bidirectional ring's as XLA:CPU
// runs them: each step's two lanes in turn, n/2p to j+1, then n/2p to j-1.
std::vector<Step> Ring(int rank, int size, size_t n, bool both_ways) {
  std::vector<Step> steps;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (int s = 0; s < 2 * (size - 1); ++s) {
    if (!both_ways) {
      steps.push_back({next, prev, n / size});
    } else {
      steps.push_back({next, prev, n / (2 * size)});
      steps.push_back({prev, next, n / (2 * size)});
    }
  }
  return steps;
}

Pattern Make(const std::string& name, int rank, int size, size_t n) {
  int peer = rank ^ 1;
  if (name == "send_first") return {name, false, {{peer, peer, n}}};
  if (name == "recv_first") return {name, true, {{peer, peer, n}}};
  if (name == "shift") return {name, false, {{(rank + 1) % size, (rank + size - 1) % size, n}}};
  if (name == "one_way") return {name, false, {rank % 2 == 0 ? Step{peer, -1, n} : Step{-1, peer, n}}};
  if (name.rfind("hd_", 0) == 0 && (size & (size - 1)) != 0) {
    Fail(name + " needs a power-of-two number of processes");
  }
  if (name == "hd_send_first") return {name, false, HalvingDoubling(rank, size, n)};
  if (name == "hd_recv_first") return {name, true, HalvingDoubling(rank, size, n)};
  if (name == "ring") return {name, false, Ring(rank, size, n, false)};
  if (name == "bidir_send_first") return {name, false, Ring(rank, size, n, true)};
  if (name == "bidir_recv_first") return {name, true, Ring(rank, size, n, true)};
  Fail("unknown pattern " + name);
}

}  // namespace

int main(int argc, char** argv) {
  std::string store_dir, out_path, sizes_text = "16MiB", patterns_text;
  int calls = 7;
  bool barrier_each = true;
  double skew_ms = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) Fail(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (a == "--store") store_dir = value("--store");
    else if (a == "--out") out_path = value("--out");
    else if (a == "--sizes") sizes_text = value("--sizes");
    else if (a == "--patterns") patterns_text = value("--patterns");
    else if (a == "--calls") calls = std::atoi(value("--calls").c_str());
    else if (a == "--barrier") barrier_each = true;
    else if (a == "--no-barrier") barrier_each = false;
    else if (a == "--skew-ms") skew_ms = std::atof(value("--skew-ms").c_str());
    else Fail("unknown argument '" + a + "' (--store DIR [--sizes 1MiB,...] [--calls N] "
              "[--no-barrier | --skew-ms S] [--patterns A,B] [--out FILE])");
  }
  if (store_dir.empty()) Fail("--store DIR is required (an empty folder all ranks share)");
  if (calls < 1) Fail("--calls must be at least 1");
  if (skew_ms < 0 || (skew_ms > 0 && !barrier_each)) {
    Fail("--skew-ms must be >= 0, and needs the barrier (not --no-barrier)");
  }
  const std::vector<size_t> sizes = ParseSizes(sizes_text);
  const int rank = EnvInt("ALLREDUCE_JAX_PROCESS_ID", "JAX_PROCESS_ID");
  const int size = EnvInt("ALLREDUCE_JAX_NUM_PROCESSES", "JAX_NUM_PROCESSES");
  if (size < 2 || size % 2) Fail("needs an even number of processes (pairs j, j^1)");
  std::vector<std::string> names = {"send_first", "recv_first", "one_way"};
  if (size >= 4) names.insert(names.begin(), "shift");
  if ((size & (size - 1)) == 0) {  // halving-doubling needs a power of two
    names.push_back("hd_send_first");
    names.push_back("hd_recv_first");
  }
  if (!patterns_text.empty()) {
    names.clear();
    std::stringstream in(patterns_text);
    std::string word;
    while (std::getline(in, word, ',')) {
      Make(word, rank, size, 1 << 20);  // an unknown name fails here, before any timing
      names.push_back(word);
    }
  }

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  gloo::transport::tcp::attr attr;
  attr.hostname = host;  // as XLA: the address this host's name resolves to
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  gloo::rendezvous::FileStore store(store_dir);
  context->connectFullMesh(store, device);

  uint64_t slot = 1000;  // the same sequence on every rank
  gloo::BarrierOptions barrier(context);
  std::ofstream out;
  if (rank == 0 && !out_path.empty()) {
    out.open(out_path, std::ios::app);
    if (!out) Fail("cannot append to --out " + out_path);
  }

  for (size_t n : sizes) {
    std::vector<char> send_data(n, 1), recv_data(n, 0);
    auto send_buf = context->createUnboundBuffer(send_data.data(), n);
    auto recv_buf = context->createUnboundBuffer(recv_data.data(), n);
    for (const auto& name : names) {
      Pattern pat = Make(name, rank, size, n);
      std::vector<double> seconds;
      for (int call = 0; call <= calls; ++call) {  // call 0: warm-up, not timed
        if (barrier_each) gloo::barrier(barrier);
        auto t0 = std::chrono::steady_clock::now();  // the late rank's clock starts late too
        if (skew_ms > 0 && rank % 2) usleep(static_cast<useconds_t>(skew_ms * 1000));
        for (const Step& st : pat.steps) {
          ++slot;
          if (pat.recv_first && st.recv_from >= 0) recv_buf->recv(st.recv_from, slot, 0, st.nbytes);
          if (st.send_to >= 0) send_buf->send(st.send_to, slot, 0, st.nbytes);
          if (!pat.recv_first && st.recv_from >= 0) recv_buf->recv(st.recv_from, slot, 0, st.nbytes);
          if (st.send_to >= 0) send_buf->waitSend();
          if (st.recv_from >= 0) recv_buf->waitRecv();
        }
        std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        if (call > 0) seconds.push_back(dt.count());
      }
      // Process 0 takes every rank's times; a call's time is its slowest rank's.
      gloo::barrier(barrier);
      const uint64_t base = slot;  // rank r sends its times on slot base + r
      std::vector<double> slowest = seconds;
      if (rank == 0) {
        std::vector<double> theirs(calls);
        auto buf = context->createUnboundBuffer(theirs.data(), calls * sizeof(double));
        for (int r = 1; r < size; ++r) {
          buf->recv(r, base + r);
          buf->waitRecv();
          for (int c = 0; c < calls; ++c) slowest[c] = std::max(slowest[c], theirs[c]);
        }
      } else {
        auto buf = context->createUnboundBuffer(seconds.data(), calls * sizeof(double));
        buf->send(0, base + rank);
        buf->waitSend();
      }
      slot = base + size;
      if (rank == 0) {
        char row[512];
        std::snprintf(row, sizeof(row),
                      "{\"p\": %d, \"bytes\": %zu, \"pattern\": \"%s\", \"barrier\": %s, \"skew_ms\": %g, "
                      "\"calls\": %d, \"median_s\": %.6f, \"min_s\": %.6f, \"max_s\": %.6f}",
                      size, n, pat.name.c_str(), barrier_each ? "true" : "false", skew_ms, calls,
                      Median(slowest), *std::min_element(slowest.begin(), slowest.end()),
                      *std::max_element(slowest.begin(), slowest.end()));
        std::cout << row << std::endl;
        if (out) out << row << std::endl;
      }
    }
  }
  gloo::barrier(barrier);
  return 0;
}
