// ddp-test-netem: delay and loss for the multi-host tests' links, in user space.
//
//   ddp-test-netem --queue N --delay-ms D [--loss P] [--seed S]
//
// This machine's kernel has no sch_netem (and cannot load modules), so tc cannot slow
// a link. Instead netns.py sends a host's outgoing packets to NFQUEUE queue N
// (iptables -j NFQUEUE --queue-bypass, inside the host's namespace), and this program,
// run in that namespace, gives each packet its verdict: dropped with probability P
// (seeded, so a run can be repeated), or accepted D ms after it arrived, in arrival
// order. Packets stay in the kernel meanwhile (only their metadata is copied here).
// On SIGTERM or SIGINT it accepts everything it holds, prints what it did and exits
// 0; once it is gone, --queue-bypass lets packets through untouched.
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  Clock::time_point due;
  uint32_t id;
};

struct State {
  nfq_q_handle* queue = nullptr;
  std::chrono::microseconds delay{0};
  double loss = 0;
  std::mt19937_64 rng;
  std::uniform_real_distribution<double> uniform{0.0, 1.0};
  std::deque<Held> held;
  uint64_t seen = 0, dropped = 0;
};

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int OnPacket(nfq_q_handle* queue, nfgenmsg*, nfq_data* packet, void* data) {
  auto* s = static_cast<State*>(data);
  const nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(packet);
  if (header == nullptr) return 0;
  const uint32_t id = ntohl(header->packet_id);
  ++s->seen;
  if (s->loss > 0 && s->uniform(s->rng) < s->loss) {
    ++s->dropped;
    return nfq_set_verdict(queue, id, NF_DROP, 0, nullptr);
  }
  s->held.push_back({Clock::now() + s->delay, id});
  return 0;
}

void Release(State& s, bool all) {
  const auto now = Clock::now();
  while (!s.held.empty() && (all || s.held.front().due <= now)) {
    nfq_set_verdict(s.queue, s.held.front().id, NF_ACCEPT, 0, nullptr);
    s.held.pop_front();
  }
}

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "ddp-test-netem: %s\n"
               "usage: ddp-test-netem --queue N --delay-ms D [--loss P] [--seed S]\n",
               why);
  std::exit(2);
}

double Number(const char* flag, const char* value, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(value, &end);
  if (errno != 0 || end == value || *end != '\0' || v < lo || v > hi) {
    Usage((std::string(flag) + " wants a number in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "], got '" + value + "'")
              .c_str());
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  State s;
  int queue_num = -1;
  uint64_t seed = 1;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage((flag + " needs a value").c_str());
    const char* value = argv[i + 1];
    if (flag == "--queue") {
      queue_num = static_cast<int>(Number("--queue", value, 0, 65535));
    } else if (flag == "--delay-ms") {
      s.delay = std::chrono::microseconds(
          static_cast<int64_t>(Number("--delay-ms", value, 0, 60000) * 1000));
    } else if (flag == "--loss") {
      s.loss = Number("--loss", value, 0, 1);
    } else if (flag == "--seed") {
      seed = static_cast<uint64_t>(Number("--seed", value, 0, 1e18));
    } else {
      Usage(("unknown flag " + flag).c_str());
    }
  }
  if (queue_num < 0) Usage("--queue is required");
  s.rng.seed(seed);

  nfq_handle* h = nfq_open();
  if (h == nullptr) {
    std::perror("ddp-test-netem: nfq_open");
    return 1;
  }
  s.queue = nfq_create_queue(h, static_cast<uint16_t>(queue_num), &OnPacket, &s);
  if (s.queue == nullptr) {
    std::fprintf(stderr, "ddp-test-netem: cannot bind queue %d (in use, or no NFQUEUE)\n",
                 queue_num);
    nfq_close(h);
    return 1;
  }
  // Metadata only: the verdict needs the packet's id, never its bytes.
  if (nfq_set_mode(s.queue, NFQNL_COPY_META, 0) < 0 ||
      nfq_set_queue_maxlen(s.queue, 65536) < 0) {
    std::perror("ddp-test-netem: queue set-up");
    return 1;
  }
  const int fd = nfq_fd(h);
  int rcvbuf = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  std::printf("ddp-test-netem: queue %d, delay %.1f ms, loss %.4f, seed %llu\n", queue_num,
              s.delay.count() / 1000.0, s.loss, static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  alignas(8) char buf[65536];
  while (!g_stop) {
    int timeout_ms = 100;
    if (!s.held.empty()) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
          s.held.front().due - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(100, wait.count())));
    }
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n > 0 && (p.revents & POLLIN)) {
      // Drain what is there. ENOBUFS (a message the kernel could not hand us) costs
      // that packet, which the kernel drops: one more loss, which TCP recovers.
      for (;;) {
        const ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got < 0) break;
        nfq_handle_packet(h, buf, static_cast<int>(got));
      }
    }
    Release(s, false);
  }
  Release(s, true);
  std::printf("ddp-test-netem: %llu packets, %llu dropped\n",
              static_cast<unsigned long long>(s.seen), static_cast<unsigned long long>(s.dropped));
  nfq_destroy_queue(s.queue);
  nfq_close(h);
  return 0;
}
