// `lair bench tokenizer --tokenizer DIR [--corpus FILE] [--repeat N]`: encode
// throughput on one thread, measured the way scripts/bench_tokenizer_hf.py
// measures HF `tokenizers`, so the two can be set side by side: the whole
// corpus as one text, then line by line (each line with its '\n'), without
// special tokens. Each mode runs once cold (the first run, which fills the
// word cache, as HF's own cache fills) and then N times warm; the cold run
// and the best warm run are reported, in MB/s (10^6 bytes) and tokens/s, by
// the wall clock and by process CPU time (the latter is steadier on a shared
// machine).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/bench_command.h"
#include "cli/command_registry.h"
#include "tokenizer/tokenizer.h"

namespace lair::cli {
namespace {

struct BenchTokenizerFlags {
  std::string tokenizer;
  std::string corpus;
  int repeat = 3;
};

std::string DefaultCorpus() {
  const char* env = std::getenv("LAIR_CORPUS");
  return std::string(env != nullptr && *env != '\0' ? env : LAIR_DEFAULT_CORPUS_DIR) +
         "/tinyshakespeare.txt";
}

struct Run {
  double wall = 1e30;  // seconds
  double cpu = 1e30;   // CPU-seconds of the process
  size_t tokens = 0;
};

// Times one call of `encode`, which returns its token count.
Run TimeOnce(const std::function<size_t()>& encode) {
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  Run run;
  run.tokens = encode();
  run.cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  run.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

void Print(const std::string& mode, size_t bytes, const Run& run) {
  std::printf(
      "%-11s %9zu tokens  wall %7.3f s %7.2f MB/s %9.0f tok/s  |  cpu %7.3f s %7.2f MB/s %9.0f "
      "tok/s\n",
      mode.c_str(), run.tokens, run.wall, bytes / run.wall / 1e6, run.tokens / run.wall, run.cpu,
      bytes / run.cpu / 1e6, run.tokens / run.cpu);
}

// Prints the cold run of `encode` and the best of `repeat` warm runs.
void Measure(const std::string& mode, size_t bytes, int repeat,
             const std::function<size_t()>& encode) {
  Print(mode + " cold", bytes, TimeOnce(encode));
  Run best;
  for (int i = 0; i < repeat; ++i) {
    const Run run = TimeOnce(encode);
    best.tokens = run.tokens;
    best.wall = std::min(best.wall, run.wall);
    best.cpu = std::min(best.cpu, run.cpu);
  }
  Print(mode + " warm", bytes, best);
}

int RunBenchTokenizer(const BenchTokenizerFlags& flags) {
  const auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = Tokenizer::Load(flags.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lair bench tokenizer: %s\n", tokenizer.status().ToString().c_str());
    return 2;
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  std::ifstream in(flags.corpus, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "lair bench tokenizer: %s: cannot open\n", flags.corpus.c_str());
    return 2;
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text.size();) {
    const size_t newline = text.find('\n', start);
    const size_t end = newline == std::string::npos ? text.size() : newline + 1;
    lines.push_back(std::string_view(text).substr(start, end - start));
    start = end;
  }
  const Tokenizer& t = **tokenizer;
  std::printf(
      "tokenizer %s (loaded in %.2f s), corpus %s: %zu bytes, %zu lines, 1 thread, warm: best of "
      "%d\n",
      flags.tokenizer.c_str(), load_seconds, flags.corpus.c_str(), text.size(), lines.size(),
      flags.repeat);
  // Lines first: the whole-text runs would otherwise warm the cache for them.
  Measure("lines", text.size(), flags.repeat, [&] {
    size_t tokens = 0;
    for (std::string_view line : lines) tokens += t.Encode(line, false).size();
    return tokens;
  });
  Measure("whole", text.size(), flags.repeat, [&] { return t.Encode(text, false).size(); });
  return 0;
}

}  // namespace

LAIR_REGISTER_COMMAND(bench_tokenizer, [](CLI::App& app) {
  CLI::App* command = BenchCommand(app)->add_subcommand(
      "tokenizer", "Encode throughput of a tokenizer, one thread");
  auto flags = std::make_shared<BenchTokenizerFlags>();
  flags->corpus = DefaultCorpus();
  command
      ->add_option("--tokenizer", flags->tokenizer,
                   "Folder holding tokenizer.json (or the file itself)")
      ->required();
  command->add_option("--corpus", flags->corpus, "Text file to encode")->capture_default_str();
  command->add_option("--repeat", flags->repeat, "Timed runs per mode (the best is reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->callback([flags] { SetExitCode(RunBenchTokenizer(*flags)); });
});

}  // namespace lair::cli
