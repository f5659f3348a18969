// Saves that lose nothing: a save killed at any point leaves the previous
// checkpoint or a valid new one at its path, never anything else; two saves
// racing to one path leave one of them whole.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "save_pattern.hpp"
#include "tensorizer.h"

extern char** environ;

namespace {

constexpr unsigned kOld = 1;
constexpr size_t kCount = 24;
constexpr size_t kBytes = 96 << 10;

pid_t spawn_save(const std::string& path, unsigned seed) {
  const std::string s = std::to_string(seed), c = std::to_string(kCount), b = std::to_string(kBytes);
  const char* argv[] = {TZ_SAVE_CHILD, path.c_str(), s.c_str(), c.c_str(), b.c_str(), nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, TZ_SAVE_CHILD, nullptr, nullptr, const_cast<char* const*>(argv), environ) == 0);
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Found {
  unsigned seed = 0;   // whose bytes the file holds
  size_t count = 0;    // tensors in it
};

// Opens `path` and reads every tensor with hash verification; fails the test
// unless it is a complete, valid file of one seed (all of its tensors, or the
// first `count` of a save that was cut short after a write call).
Found check_file(const std::string& path) {
  tz_reader* r = nullptr;
  const int rc = tz_reader_open(&r, path.c_str(), nullptr);
  INFO(tz_error_last());
  REQUIRE(rc == TZ_OK);
  Found f;
  REQUIRE(tz_reader_tensor_count(&f.count, r) == TZ_OK);
  REQUIRE(f.count >= 1);
  REQUIRE(f.count <= kCount);
  std::vector<uint8_t> got(kBytes);
  for (uint64_t i = 0; i < f.count; ++i) {
    INFO("tensor " << i);
    REQUIRE(tz_reader_read(r, i, got.data(), got.size(), TZ_READ_VERIFY_HASH) == TZ_OK);
    if (i == 0) {
      for (unsigned s = 1; s < 8 && f.seed == 0; ++s) {
        if (got[0] == tz_test::fill_byte(s, 0, 0) && got[1] == tz_test::fill_byte(s, 0, 1)) f.seed = s;
      }
      REQUIRE(f.seed != 0);
    }
    bool same = true;
    for (size_t k = 0; k < kBytes && same; ++k) same = got[k] == tz_test::fill_byte(f.seed, size_t(i), k);
    REQUIRE(same);
  }
  tz_reader_free(r);
  return f;
}

std::string fresh_dir(const char* name) {
  const std::string dir = tz_test::temp_path(name);
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  return dir;
}

void remove_dir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink((dir + "/" + n).c_str());
    }
    closedir(d);
  }
  ::rmdir(dir.c_str());
}

}  // namespace

TEST_CASE("a save killed at any point leaves the old checkpoint or a valid new one") {
  const std::string dir = fresh_dir("kill");
  const std::string path = dir + "/model.tensors";
  REQUIRE(wait_exit(spawn_save(path, kOld)) == 0);
  REQUIRE(check_file(path).count == kCount);

  // How long one whole save takes here: kill points are spread over it.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(wait_exit(spawn_save(dir + "/probe.tensors", 2)) == 0);
  const auto whole = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  ::unlink((dir + "/probe.tensors").c_str());

  std::mt19937 rng(12345);
  std::uniform_int_distribution<long> at(0, long(whole.count() * 12 / 10) + 1);
  size_t old_kept = 0, new_found = 0;
  for (int point = 0; point < 60; ++point) {
    const unsigned seed = 2 + unsigned(point % 5);
    const pid_t pid = spawn_save(path, seed);
    std::this_thread::sleep_for(std::chrono::microseconds(at(rng)));
    ::kill(pid, SIGKILL);
    wait_exit(pid);
    INFO("kill point " << point);
    const Found f = check_file(path);
    if (f.seed == kOld) {
      CHECK(f.count == kCount);  // the old checkpoint, whole
      ++old_kept;
    } else {
      CHECK(f.seed == seed);  // the new one, valid as of its last write call
      ++new_found;
      REQUIRE(wait_exit(spawn_save(path, kOld)) == 0);  // the old one back for the next point
    }
  }
  WARN("kill points: " << old_kept << " left the old checkpoint, " << new_found << " a valid new one");
  remove_dir(dir);
}

TEST_CASE("two saves to one path at once leave one of them whole") {
  const std::string dir = fresh_dir("race");
  const std::string path = dir + "/model.tensors";
  REQUIRE(wait_exit(spawn_save(path, kOld)) == 0);
  for (int round = 0; round < 8; ++round) {
    const pid_t a = spawn_save(path, 2), b = spawn_save(path, 3);
    const int ea = wait_exit(a), eb = wait_exit(b);
    INFO("round " << round << ": exits " << ea << ", " << eb);
    // Each saver succeeds, or is told its file was replaced (3).
    CHECK((ea == 0 || ea == 3));
    CHECK((eb == 0 || eb == 3));
    CHECK((ea == 0 || eb == 0));
    const Found f = check_file(path);
    CHECK(f.count == kCount);
    CHECK((f.seed == 2 || f.seed == 3));
    if (ea == 3) CHECK(f.seed == 3);
    if (eb == 3) CHECK(f.seed == 2);
  }
  // Nothing is left beside it but the checkpoint.
  size_t entries = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) entries += e->d_name[0] != '.' || std::string(e->d_name).size() > 2;
    closedir(d);
  }
  CHECK(entries == 1);
  remove_dir(dir);
}

TEST_CASE("the path keeps its previous file until the first write call completes") {
  const std::string dir = fresh_dir("publish");
  const std::string path = dir + "/model.tensors";
  REQUIRE(wait_exit(spawn_save(path, kOld)) == 0);
  tz_writer* w = nullptr;
  REQUIRE(tz_writer_open(&w, path.c_str(), nullptr) == TZ_OK);
  CHECK(check_file(path).seed == kOld);  // opening replaces nothing
  std::vector<uint64_t> shape{kBytes};
  std::vector<uint8_t> data(kBytes);
  for (size_t k = 0; k < kBytes; ++k) data[k] = tz_test::fill_byte(5, 0, k);
  const std::string name = "t0";  // desc() keeps a pointer to it
  tz_tensor_desc bad = tz_test::desc(name, "|u1", 3, shape, data.data(), kBytes - 1);
  CHECK(tz_writer_write(w, &bad, 1, 1) == TZ_E_INVALID_ARG);
  CHECK(check_file(path).seed == kOld);  // nor does a refused call
  tz_tensor_desc good = tz_test::desc(name, "|u1", 3, shape, data.data(), kBytes);
  const int wrc = tz_writer_write(w, &good, 1, 1);
  INFO(tz_error_last());
  REQUIRE(wrc == TZ_OK);
  const Found f = check_file(path);  // now the new file, valid while still open
  CHECK(f.seed == 5);
  CHECK(f.count == 1);
  CHECK(tz_writer_close(w) == TZ_OK);
  tz_writer_free(w);
  // Only the checkpoint is in the folder: no temporary file is left.
  size_t entries = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) entries += e->d_name[0] != '.' || std::string(e->d_name).size() > 2;
    closedir(d);
  }
  CHECK(entries == 1);
  remove_dir(dir);
}
