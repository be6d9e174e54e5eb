// Sending and receiving bytes with an attached file descriptor over a Unix
// socket (SCM_RIGHTS), for handing memfd arenas to clients.
#pragma once

#include <cstddef>
#include <span>

#include "tierkv/status.h"

namespace tierkv::transport {

// Writes all of `bytes` to `socket_fd`, attaching `fd_to_send` (not owned;
// the kernel duplicates it) to the first byte when it is >= 0. Waits with
// poll() when the socket is non-blocking and full. IOError on failure.
Status SendAllWithFd(int socket_fd, std::span<const std::byte> bytes,
                     int fd_to_send);

// Reads exactly `bytes.size()` bytes. When a descriptor arrives with them
// and `received_fd` points at -1, it is stored there (the caller owns it);
// any other descriptor that arrives is closed. Unavailable on EOF, IOError on
// other failures (including the socket's receive timeout).
Status RecvAllWithFd(int socket_fd, std::span<std::byte> bytes,
                     int* received_fd);

// Reads what is available, up to `bytes.size()`, from a non-blocking socket:
// the number of bytes read (0 when none are available yet). A descriptor
// that arrives is stored in *received_fd when that is -1, else closed.
// Unavailable on EOF, IOError on other failures.
Result<size_t> RecvSomeWithFd(int socket_fd, std::span<std::byte> bytes,
                              int* received_fd);

}  // namespace tierkv::transport
