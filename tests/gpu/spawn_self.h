// RunThisBinaryAs: the GPU tests' second process (an IPC importer, an
// engine that dies) is this test binary again, running one test with an
// environment variable that tells it what to do. A re-executed binary, not
// fork(): a child of a process that initialised CUDA cannot use it.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace tierkv::testing {

// Runs this binary with --gtest_filter=`test` and `env` ("NAME=value")
// added to the environment, and waits for it. Returns its exit status, or
// 128 + the signal that ended it, or -1 when it could not start.
inline int RunThisBinaryAs(const std::string& test, const std::string& env) {
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0) return -1;
  self.resize(static_cast<size_t>(n));
  std::string filter = "--gtest_filter=" + test;
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()) !=
      0) {
    return -1;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace tierkv::testing
