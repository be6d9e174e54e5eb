// Implements RedisDirectory (redis_directory.h): the schema and its write
// script, the background writer with its heartbeat and re-publish, the
// lookup path and its circuit breaker.
#include "transport/directory/redis_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "common/sync_point.h"

namespace tierkv::transport {
namespace {

using Clock = Directory::Clock;

constexpr size_t kMaxIdBytes = 64;
constexpr size_t kMaxAddressBytes = 1024;
constexpr size_t kMaxPasswordFileBytes = 4096;
constexpr uint32_t kMaxBatchPages = 65536;
// The `version` field of a node's registration: the schema this code
// writes, so that a later schema can tell old nodes apart. 1: page entries
// were SETs under :p:; 2: holder lists (strings) under :h:.
constexpr std::string_view kSchemaVersion = "2";
// What follows each node id in a page entry: a byte no id holds.
constexpr char kHolderSeparator = ',';

// The write script: applies publish/unpublish/ForgetHolder ops to page
// entries, each key atomically, so that nodes adding and removing
// themselves at once never lose each other's ids. Hand-written Lua rather
// than plain commands because a page's holders are one string (so that a
// Lookup is one MGET: Redis has no command that reads many sets), and no
// Redis command adds or removes one token of a string atomically.
//   KEYS[i]      a page entry, tkv:{c}:{ns}:h:{page}
//   ARGV[1]      page_ttl in seconds
//   ARGV[1 + i]  the op on KEYS[i]: '+' or '-', then a node id (1-64 bytes
//                of [A-Za-z0-9_.-], checked by the caller)
// '+' appends the id when absent and, either way, sets the TTL; '-'
// removes it (every copy), keeping the TTL, and DELs the key when
// no id is left. A value that is not a holder list (what SplitHolderList
// refuses: the patterns below test the same) counts as empty: '+' replaces
// it, '-' leaves it alone. GET is pcall'ed so that a key of another type
// is such a value too (SET replaces it). Returns the number of keys.
// Costs 3-4 us of server time per key (INFO commandstats, on the VM of
// redis_directory.h), against about 2 for the SADD + EXPIRE of version 1.
constexpr std::string_view kWriteScript = R"lua(
local ttl = ARGV[1]
local too_long = string.rep('[^,]', 65)  -- an id of over 64 bytes
for i, key in ipairs(KEYS) do
  local add = string.byte(ARGV[i + 1]) == 43  -- '+'
  local id = string.sub(ARGV[i + 1], 2) .. ','
  local value = redis.pcall('GET', key)
  if type(value) ~= 'string' or
      not string.find(value, '^[A-Za-z0-9_.%-][A-Za-z0-9_.%-,]*,$') or
      string.find(value, ',,', 1, true) or
      (#value > 64 and string.find(value, too_long)) then
    value = nil
  end
  local at = value and string.find(',' .. value, ',' .. id, 1, true)
  if add then
    if at then
      redis.call('EXPIRE', key, ttl)
    else
      redis.call('SET', key, (value or '') .. id, 'EX', ttl)
    end
  elseif at then
    repeat
      value = string.sub(value, 1, at - 1) .. string.sub(value, at + #id)
      at = string.find(',' .. value, ',' .. id, 1, true)
    until not at
    if value == '' then
      redis.call('DEL', key)
    else
      redis.call('SET', key, value, 'KEEPTTL')
    end
  end
end
return #KEYS
)lua";

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

bool IsValidId(std::string_view id) {
  return !id.empty() && id.size() <= kMaxIdBytes &&
         std::all_of(id.begin(), id.end(), IsIdChar);
}

// Splits a page entry's value ("id,id,") into `ids`, views into `value`.
// False when it is not such a list (empty, no final separator, an empty or
// invalid id): `ids` then holds what came before the fault.
bool SplitHolderList(std::string_view value,
                     std::vector<std::string_view>* ids) {
  if (value.empty() || value.back() != kHolderSeparator) return false;
  size_t begin = 0;
  while (begin < value.size()) {
    const size_t end = value.find(kHolderSeparator, begin);  // not npos
    const std::string_view id = value.substr(begin, end - begin);
    if (!IsValidId(id)) return false;
    ids->push_back(id);
    begin = end + 1;
  }
  return true;
}

bool IsNoScript(const RedisReply& reply) {
  return reply.is_error() &&
         std::string_view(reply.str).starts_with("NOSCRIPT");
}

std::string Hex64(uint64_t value) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx",
                static_cast<unsigned long long>(value));
  return out;
}

uint64_t RandomNonZero() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) {
    value = (uint64_t{device()} << 32) ^ uint64_t { device() };
  }
  return value;
}

std::string Millis(std::chrono::nanoseconds d) {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// Reads the password, refusing a file that group or others may access: a
// directory password grants write access to every node's view of the
// cluster.
Result<std::string> ReadPasswordFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message = "cannot open the directory password file " +
                                path + ": " + std::strerror(err);
    if (err == ENOENT) return Status::NotFound(message);
    if (err == EACCES) return Status::PermissionDenied(message);
    return Status::IOError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError("cannot stat the directory password file " + path +
                           ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument("the directory password file " + path +
                                   " is not a regular file");
  }
  if ((st.st_mode & 0077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o",
                  static_cast<unsigned>(st.st_mode & 07777));
    return Status::PermissionDenied(
        "the directory password file " + path + " has mode " + mode +
        ", which lets group or others access it; run chmod 600 " + path);
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxPasswordFileBytes) {
    ::close(fd);
    return Status::InvalidArgument("the directory password file " + path +
                                   " is larger than 4 KiB");
  }
  std::string password(kMaxPasswordFileBytes + 1, '\0');
  size_t size = 0;
  while (size < password.size()) {
    const ssize_t n =
        ::read(fd, password.data() + size, password.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::IOError("cannot read the directory password file " + path +
                             ": " + std::strerror(err));
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  ::close(fd);
  password.resize(size);
  while (!password.empty() &&
         (password.back() == '\n' || password.back() == '\r')) {
    password.pop_back();
  }
  if (password.empty()) {
    return Status::InvalidArgument("the directory password file " + path +
                                   " is empty");
  }
  if (password.find_first_of("\r\n") != std::string::npos) {
    return Status::InvalidArgument("the directory password file " + path +
                                   " holds more than one line");
  }
  return password;
}

// A server-side refusal in a reply, as a Status (NOPERM: the ACL user may
// not touch the key).
Status ReplyError(std::string_view what, const RedisReply& reply) {
  std::string message(what);
  message += ": ";
  message += reply.str;
  if (std::string_view(reply.str).starts_with("NOPERM") ||
      std::string_view(reply.str).starts_with("NOAUTH")) {
    return Status::PermissionDenied(message);
  }
  return Status::Internal(message);
}

}  // namespace

// The sink handed to Options::republish: synchronous pipelined writes on
// the writer's connection.
class RedisDirectory::Republisher final : public DirectoryRepublisher {
 public:
  explicit Republisher(RedisDirectory* directory) : directory_(directory) {}

  Status Publish(const DirectoryNamespace& ns,
                 std::span<const PageHash> pages) override {
    if (!failure_.ok()) return failure_;
    // The caller's mistake, not the directory's: no retry of the whole
    // re-publish for it.
    TIERKV_RETURN_IF_ERROR(ns.Validate());
    const auto prefix =
        std::make_shared<const std::string>(directory_->PageKeyPrefix(ns));
    std::vector<PendingOp> ops;
    const size_t batch = directory_->options_.write_batch_pages;
    for (size_t begin = 0; begin < pages.size(); begin += batch) {
      const size_t end = std::min(pages.size(), begin + batch);
      // The destructor waits for this thread: stop between batches.
      if (directory_->Stopping()) {
        failure_ = Status::Shutdown("directory is closing");
        return failure_;
      }
      // One io_timeout per batch, heartbeat included.
      const Clock::time_point deadline =
          Clock::now() + directory_->options_.io_timeout;
      // A long re-publish must not let the registration expire.
      // A refused heartbeat (connection kept) is counted and retried next
      // period; only a lost connection stops the re-publish.
      if (Status beat = directory_->HeartbeatIfDue(deadline);
          !beat.ok() && directory_->writer_connection_ == nullptr) {
        failure_ = beat;
        return beat;
      }
      ops.clear();
      for (size_t i = begin; i < end; ++i) {
        ops.push_back(
            PendingOp{/*publish=*/true, prefix, pages[i], /*other_node=*/{}});
      }
      const Status written = directory_->WriteOps(ops, deadline);
      if (!written.ok()) {
        failure_ = written;
        return written;
      }
    }
    return Status::OK();
  }

  const Status& failure() const { return failure_; }

 private:
  RedisDirectory* const directory_;  // owns the writer thread we run on
  Status failure_;
};

Status RedisDirectory::Options::Validate() const {
  if (url.empty()) {
    return Status::InvalidArgument("directory url is required");
  }
  TIERKV_RETURN_IF_ERROR(RedisUrl::Parse(url).status());
  if (!IsValidId(cluster)) {
    return Status::InvalidArgument(
        "directory cluster name must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  if (!IsValidId(node_id)) {
    return Status::InvalidArgument(
        "directory node_id must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  if (address.size() > kMaxAddressBytes) {
    return Status::InvalidArgument(
        "directory node address is longer than 1024 bytes");
  }
  // now + duration must not overflow, and 2 * duration neither.
  constexpr auto kMaxDuration = std::chrono::hours(1);
  if (liveness_ttl > kMaxDuration || heartbeat_period > kMaxDuration ||
      live_refresh_period > kMaxDuration || lookup_budget > kMaxDuration ||
      io_timeout > kMaxDuration || max_backoff > kMaxDuration) {
    return Status::InvalidArgument(
        "directory durations (but page_ttl) must be at most 1 h");
  }
  if (page_ttl > std::chrono::hours(24 * 365)) {
    return Status::InvalidArgument("directory page_ttl is over a year");
  }
  if (liveness_ttl < std::chrono::milliseconds(100)) {
    return Status::InvalidArgument("directory liveness_ttl is under 100 ms");
  }
  if (heartbeat_period <= std::chrono::milliseconds(0) ||
      2 * heartbeat_period > liveness_ttl) {
    return Status::InvalidArgument(
        "directory heartbeat_period must be positive and at most half of "
        "liveness_ttl");
  }
  if (live_refresh_period < std::chrono::milliseconds(10)) {
    return Status::InvalidArgument(
        "directory live_refresh_period is under 10 ms");
  }
  if (page_ttl < std::chrono::seconds(1)) {
    return Status::InvalidArgument("directory page_ttl is under 1 s");
  }
  if (lookup_budget <= std::chrono::microseconds(0)) {
    return Status::InvalidArgument("directory lookup_budget is not positive");
  }
  if (lookup_batch_pages == 0 || lookup_batch_pages > kMaxBatchPages) {
    return Status::InvalidArgument(
        "directory lookup_batch_pages must be in [1, 65536]");
  }
  if (write_batch_pages == 0 || write_batch_pages > kMaxBatchPages) {
    return Status::InvalidArgument(
        "directory write_batch_pages must be in [1, 65536]");
  }
  if (write_script_pages == 0 || write_script_pages > kMaxBatchPages) {
    return Status::InvalidArgument(
        "directory write_script_pages must be in [1, 65536]");
  }
  if (max_queued_pages == 0) {
    return Status::InvalidArgument("directory max_queued_pages is zero");
  }
  if (io_timeout <= std::chrono::milliseconds(0)) {
    return Status::InvalidArgument("directory io_timeout is not positive");
  }
  if (min_backoff <= std::chrono::milliseconds(0) ||
      max_backoff < min_backoff) {
    return Status::InvalidArgument(
        "directory backoff must satisfy 0 < min_backoff <= max_backoff");
  }
  return Status::OK();
}

RedisDirectory::RedisDirectory(const Options& options, RedisUrl url,
                               std::string password)
    : options_(options),
      url_(std::move(url)),
      password_(std::move(password)),
      self_{options.node_id, options.address,
            options.epoch != 0 ? options.epoch : RandomNonZero()},
      prefix_("tkv:" + options.cluster + ":"),
      node_key_(prefix_ + "node:" + options.node_id),
      nodes_key_(prefix_ + "nodes"),
      epoch_key_(prefix_ + "dir_epoch"),
      live_(std::make_shared<const std::map<std::string, DirectoryNode>>()) {}

Result<std::unique_ptr<RedisDirectory>> RedisDirectory::Open(
    const Options& options) {
  TIERKV_RETURN_IF_ERROR(options.Validate());
  Result<RedisUrl> url = RedisUrl::Parse(options.url);
  if (!url.ok()) return url.status();
  std::string password;
  if (!options.password_file.empty()) {
    Result<std::string> read = ReadPasswordFile(options.password_file);
    if (!read.ok()) return read.status();
    password = std::move(*read);
  }
  if (!url->user.empty() && password.empty()) {
    return Status::InvalidArgument(
        "directory url names a user but no password_file is set");
  }
  std::unique_ptr<RedisDirectory> directory(
      new RedisDirectory(options, std::move(*url), std::move(password)));
  // Refusals (credentials, ACL, database) are configuration errors: fail
  // now. An absent or hung server is an outage: open "down" and retry.
  const Clock::time_point deadline = Clock::now() + options.io_timeout;
  const Status connected = directory->ConnectWriter(deadline);
  if (!connected.ok() && connected.code() != StatusCode::kUnavailable) {
    return connected;
  }
  // Lookups never connect: hand them a ready connection now when we can;
  // else the background thread does when the server is back.
  if (connected.ok()) directory->EnsureLookupConnection(deadline);
  RedisDirectory* raw = directory.get();
  directory->writer_ = std::thread([raw] { raw->WriterLoop(); });
  return directory;
}

RedisDirectory::~RedisDirectory() {
  {
    MutexLock lock(&queue_mu_);
    stopping_ = true;
    queue_cv_.SignalAll();
    flushed_cv_.SignalAll();
    refreshed_cv_.SignalAll();
  }
  if (writer_.joinable()) writer_.join();
}

bool RedisDirectory::Stopping() const {
  MutexLock lock(&queue_mu_);
  return stopping_;
}

std::string RedisDirectory::PageKeyPrefix(std::string_view cluster,
                                          const DirectoryNamespace& ns) {
  std::string prefix = "tkv:";
  prefix += cluster;
  prefix += ':';
  prefix += ns.KeyComponent();
  prefix += ":h:";
  return prefix;
}

Result<std::vector<std::string>> RedisDirectory::ParseHolderList(
    std::string_view value) {
  std::vector<std::string_view> ids;
  if (!SplitHolderList(value, &ids)) {
    return Status::Corruption("not a directory holder list");
  }
  return std::vector<std::string>(ids.begin(), ids.end());
}

// ---------------------------------------------------------------------------
// Publish queue.

Status RedisDirectory::Publish(const DirectoryNamespace& ns,
                               std::span<const PageHash> pages) {
  return Enqueue(/*publish=*/true, ns, pages, /*other_node=*/nullptr);
}

Status RedisDirectory::Unpublish(const DirectoryNamespace& ns,
                                 std::span<const PageHash> pages) {
  return Enqueue(/*publish=*/false, ns, pages, /*other_node=*/nullptr);
}

Status RedisDirectory::ForgetHolder(const DirectoryNamespace& ns,
                                    std::span<const PageHash> pages,
                                    std::string_view node_id) {
  if (!IsValidId(node_id)) {
    return Status::InvalidArgument(
        "ForgetHolder: node id must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  return Enqueue(/*publish=*/false, ns, pages,
                 std::make_shared<const std::string>(node_id));
}

Status RedisDirectory::Enqueue(bool publish, const DirectoryNamespace& ns,
                               std::span<const PageHash> pages,
                               std::shared_ptr<const std::string> other_node) {
  TIERKV_RETURN_IF_ERROR(ns.Validate());
  if (pages.empty()) return Status::OK();
  // Built before taking the lock: the writer thread contends for it.
  const auto prefix = std::make_shared<const std::string>(PageKeyPrefix(ns));
  MutexLock lock(&queue_mu_);
  if (stopping_) return Status::Shutdown("directory is closing");
  if (queue_.size() + pages.size() > options_.max_queued_pages) {
    dropped_pages_.fetch_add(pages.size(), std::memory_order_relaxed);
    if (publish) publishes_dropped_.store(true, std::memory_order_relaxed);
    return Status::ResourceExhausted(
        "directory write queue full (" + std::to_string(queue_.size()) +
        " of " + std::to_string(options_.max_queued_pages) +
        " pages): dropped " + std::to_string(pages.size()) + " pages");
  }
  for (const PageHash& page : pages) {
    queue_.push_back(PendingOp{publish, prefix, page, other_node});
  }
  queued_ops_total_ += pages.size();
  queue_cv_.Signal();
  return Status::OK();
}

Status RedisDirectory::Flush(Clock::time_point deadline) {
  // wait_until with time_point::max() overflows inside libstdc++.
  deadline = std::min(deadline, Clock::now() + std::chrono::hours(24));
  MutexLock lock(&queue_mu_);
  const uint64_t target = queued_ops_total_;
  while (done_ops_ < target) {
    if (stopping_) return Status::Shutdown("directory is closing");
    if (!flushed_cv_.WaitUntil(&queue_mu_, deadline) && done_ops_ < target) {
      return Status::Unavailable(
          "directory writes not flushed by the deadline: " +
          std::to_string(target - done_ops_) + " pages outstanding");
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Background writer.

void RedisDirectory::WriterFailed(bool timed_out) {
  writer_connection_.reset();
  writer_backoff_ = writer_backoff_.count() == 0
                        ? Clock::duration(options_.min_backoff)
                        : std::min<Clock::duration>(2 * writer_backoff_,
                                                    options_.max_backoff);
  writer_retry_at_ = Clock::now() + writer_backoff_;
  MutexLock lock(&mu_);
  up_ = false;
  // A slow server is the lookups' own budget's business: only an IO error
  // (refused, reset) tells them the server is gone.
  if (!timed_out) RecordFailureLocked(Clock::now());
}

Status RedisDirectory::ConnectWriter(Clock::time_point deadline) {
  bool timed_out = false;
  Result<std::unique_ptr<RedisConnection>> connection =
      RedisConnection::Connect(url_, password_, deadline, &timed_out);
  if (!connection.ok()) {
    WriterFailed(timed_out);
    return connection.status();
  }
  if (writer_connected_once_) {
    reconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  writer_connected_once_ = true;
  writer_connection_ = std::move(*connection);
  TIERKV_RETURN_IF_ERROR(Heartbeat(deadline));
  Result<std::map<std::string, DirectoryNode>> live =
      FetchLiveNodes(*writer_connection_, deadline, /*prune=*/true);
  if (!live.ok()) {
    if (writer_connection_->broken()) {
      WriterFailed(writer_connection_->timed_out());
    } else if (live.status().code() == StatusCode::kUnavailable) {
      WriterFailed(/*timed_out=*/true);  // out of time before sending
    }
    return live.status();
  }
  InstallLiveNodes(std::move(*live));
  writer_backoff_ = Clock::duration(0);
  // Once per directory (the server's cache is shared by its connections):
  // at Open, an ACL without scripting fails the Open rather than every
  // write. A restarted server's lost cache is WriteOps's business.
  if (script_sha_.empty()) return LoadScript(deadline);
  return Status::OK();
}

Status RedisDirectory::LoadScript(Clock::time_point deadline) {
  Result<RedisReply> sha = writer_connection_->Command(
      {"SCRIPT", "LOAD", std::string(kWriteScript)}, deadline);
  if (!sha.ok()) {
    WriterFailed(writer_connection_->timed_out() ||
                 !writer_connection_->broken());
    return sha.status();
  }
  if (sha->is_error()) {
    return ReplyError("directory refused to load its write script", *sha);
  }
  if (sha->type != RedisReply::Type::kString || sha->str.empty()) {
    return Status::Internal("directory answered SCRIPT LOAD without a SHA1");
  }
  script_sha_ = std::move(sha->str);
  return Status::OK();
}

Status RedisDirectory::Heartbeat(Clock::time_point deadline) {
  const std::string candidate_epoch =
      Hex64(RandomNonZero()) + Hex64(RandomNonZero());
  const std::string ttl_ms = std::to_string(options_.liveness_ttl.count());
  // MULTI: a registration without its expiry would keep a dead node alive.
  const std::vector<RedisCommand> commands = {
      {"MULTI"},
      {"HSET", node_key_, "addr", self_.address, "epoch",
       std::to_string(self_.epoch), "version", std::string(kSchemaVersion)},
      {"PEXPIRE", node_key_, ttl_ms},
      {"EXEC"},
      {"SADD", nodes_key_, self_.node_id},
      {"SET", epoch_key_, candidate_epoch, "NX"},
      {"GET", epoch_key_},
  };
  Result<std::vector<RedisReply>> replies =
      writer_connection_->Pipeline(commands, deadline);
  if (!replies.ok()) {
    heartbeat_errors_.fetch_add(1, std::memory_order_relaxed);
    WriterFailed(writer_connection_->timed_out() ||
                 !writer_connection_->broken());
    return replies.status();
  }
  Status status;
  {
    for (const RedisReply& reply : *replies) {
      if (reply.is_error()) {
        status = ReplyError("directory refused the node registration", reply);
        break;
      }
    }
    const RedisReply& exec = (*replies)[3];
    if (status.ok() && exec.type != RedisReply::Type::kArray) {
      status = Status::Internal("directory registration transaction aborted");
    }
    if (status.ok() && exec.type == RedisReply::Type::kArray) {
      for (const RedisReply& reply : exec.elements) {
        if (reply.is_error()) {
          status = ReplyError("directory refused the node registration", reply);
          break;
        }
      }
    }
  }
  if (!status.ok()) {
    // A refusal (OOM, NOPERM) says the server is up: keep the connection,
    // leave the lookup breaker alone, and try again next period.
    heartbeat_errors_.fetch_add(1, std::memory_order_relaxed);
    next_heartbeat_ = Clock::now() + options_.heartbeat_period;
    return status;
  }
  const RedisReply& epoch = (*replies)[6];
  if (epoch.type == RedisReply::Type::kString && epoch.str != dir_epoch_) {
    // Empty: our first look (nothing of ours can be missing yet).
    if (!dir_epoch_.empty() && options_.republish) republish_pending_ = true;
    dir_epoch_ = epoch.str;
  }
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  next_heartbeat_ = Clock::now() + options_.heartbeat_period;
  MutexLock lock(&mu_);
  RecordWriterSuccessLocked(Clock::now());
  return Status::OK();
}

Status RedisDirectory::HeartbeatIfDue(Clock::time_point deadline) {
  if (Clock::now() < next_heartbeat_) return Status::OK();
  // Not again at once if it fails: the reconnect path beats first anyway.
  next_heartbeat_ = Clock::now() + options_.heartbeat_period;
  return Heartbeat(deadline);
}

Status RedisDirectory::RunRepublish() {
  // Cleared first: a loss noticed by a heartbeat during the callback sets
  // it again, and then the catalog is re-published once more.
  republish_pending_ = false;
  Republisher sink(this);
  options_.republish(sink);
  if (!sink.failure().ok()) {
    republish_pending_ = true;  // again once reconnected
    return sink.failure();      // WriteOps or Heartbeat has failed us
  }
  republishes_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Status RedisDirectory::WriteOps(std::span<const PendingOp> ops,
                                Clock::time_point deadline) {
  if (script_sha_.empty()) {
    // Refused at Open or at a reconnect (ACL): try again, once per batch.
    const Status loaded = LoadScript(deadline);
    if (!loaded.ok()) {
      write_errors_.fetch_add(1, std::memory_order_relaxed);
      // Connection dropped: the batch is kept and retried on reconnect.
      if (writer_connection_ == nullptr) return loaded;
      return Status::OK();  // refused: would be refused again
    }
  }
  const std::string ttl_s = std::to_string(options_.page_ttl.count());
  const size_t per_call = options_.write_script_pages;
  // calls[c] carries ops [c * per_call, (c + 1) * per_call).
  std::vector<RedisCommand> calls;
  calls.reserve((ops.size() + per_call - 1) / per_call);
  for (size_t begin = 0; begin < ops.size(); begin += per_call) {
    const size_t end = std::min(ops.size(), begin + per_call);
    RedisCommand call = {"EVALSHA", script_sha_, std::to_string(end - begin)};
    call.reserve(call.size() + 2 * (end - begin) + 1);
    for (size_t i = begin; i < end; ++i) {
      call.push_back(*ops[i].key_prefix + ops[i].page.ToHex());
    }
    call.push_back(ttl_s);
    for (size_t i = begin; i < end; ++i) {
      const PendingOp& op = ops[i];
      std::string arg(1, op.publish ? '+' : '-');
      arg += op.other_node ? *op.other_node : self_.node_id;
      call.push_back(std::move(arg));
    }
    calls.push_back(std::move(call));
  }

  uint64_t published = 0;
  uint64_t unpublished = 0;
  uint64_t forgotten = 0;
  bool refused = false;
  // Counts call `c`'s ops as written when `ok`; else the batch as refused.
  // A refusal (OOM, NOPERM) would be refused again: count it and move on
  // rather than retry forever; the directory is a hint.
  const auto tally = [&](size_t c, bool ok) {
    if (!ok) {
      refused = true;
      return;
    }
    const size_t end = std::min(ops.size(), (c + 1) * per_call);
    for (size_t i = c * per_call; i < end; ++i) {
      if (ops[i].publish) {
        ++published;
      } else {
        ++(ops[i].other_node ? forgotten : unpublished);
      }
    }
  };
  const auto failed = [&](const Status& status) {
    write_errors_.fetch_add(1, std::memory_order_relaxed);
    WriterFailed(writer_connection_->timed_out() ||
                 !writer_connection_->broken());
    return status;
  };

  Result<std::vector<RedisReply>> replies =
      writer_connection_->Pipeline(calls, deadline);
  if (!replies.ok()) return failed(replies.status());
  size_t first_lost = calls.size();  // the first call answered NOSCRIPT
  for (size_t c = 0; c < calls.size(); ++c) {
    if (IsNoScript((*replies)[c])) {
      first_lost = c;
      break;
    }
    tally(c, !(*replies)[c].is_error());
  }
  if (first_lost < calls.size()) {
    // The server lost the script (restarted, SCRIPT FLUSH): load it and
    // send every call from the first refused one again, in order. Calls
    // after it that ran anyway (another node reloaded the script in
    // between) run twice, which leaves each key as once: the last op on a
    // key decides whether the id is in it, and a second add only refreshes
    // the TTL.
    std::vector<RedisCommand> again;
    again.reserve(1 + calls.size() - first_lost);
    again.push_back({"SCRIPT", "LOAD", std::string(kWriteScript)});
    again.insert(again.end(),
                 std::make_move_iterator(calls.begin() + first_lost),
                 std::make_move_iterator(calls.end()));
    replies = writer_connection_->Pipeline(again, deadline);
    if (!replies.ok()) return failed(replies.status());
    // A second loss within one round trip (flushed again) is counted as a
    // refusal, not chased.
    for (size_t c = first_lost; c < calls.size(); ++c) {
      tally(c, !(*replies)[1 + c - first_lost].is_error());
    }
  }
  if (refused) write_errors_.fetch_add(1, std::memory_order_relaxed);
  published_pages_.fetch_add(published, std::memory_order_relaxed);
  unpublished_pages_.fetch_add(unpublished, std::memory_order_relaxed);
  forgotten_holders_.fetch_add(forgotten, std::memory_order_relaxed);
  MutexLock lock(&mu_);
  RecordWriterSuccessLocked(Clock::now());
  return Status::OK();
}

void RedisDirectory::WriterLoop() {
  next_heartbeat_ = Clock::now() + options_.heartbeat_period;
  Clock::time_point next_refresh = Clock::now() + options_.live_refresh_period;
  std::vector<PendingOp> batch;  // taken from the queue, not yet written
  for (;;) {
    uint64_t refresh_target = 0;  // RefreshLiveNodes requests to serve
    {
      MutexLock lock(&queue_mu_);
      while (!stopping_) {
        const Clock::time_point now = Clock::now();
        const bool connected = writer_connection_ != nullptr;
        const bool lookup_wanted =
            lookup_connection_wanted_.load(std::memory_order_acquire);
        if (!connected) {
          if (now >= writer_retry_at_) break;
        } else if (now >= next_heartbeat_ || now >= next_refresh ||
                   republish_pending_ || !batch.empty() || !queue_.empty() ||
                   refresh_requests_ > refresh_served_ ||
                   (lookup_wanted && now >= lookup_connect_at_)) {
          break;
        }
        Clock::time_point wake = writer_retry_at_;
        if (connected) {
          wake = std::min(next_heartbeat_, next_refresh);
          if (lookup_wanted) wake = std::min(wake, lookup_connect_at_);
        }
        queue_cv_.WaitUntil(&queue_mu_, wake);
      }
      if (stopping_) break;
      refresh_target = refresh_requests_;
      if (batch.empty() && writer_connection_ != nullptr) {
        const size_t take =
            std::min<size_t>(queue_.size(), options_.write_batch_pages);
        batch.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.begin() + take));
        queue_.erase(queue_.begin(), queue_.begin() + take);
        in_flight_ops_ = take;
      }
    }
    // Every step below is bounded by one io_timeout, and the destructor is
    // checked between steps.
    if (writer_connection_ == nullptr) {
      if (ConnectWriter(Clock::now() + options_.io_timeout).ok()) {
        next_refresh = Clock::now() + options_.live_refresh_period;
      }
      continue;
    }
    if (Stopping()) break;
    EnsureLookupConnection(Clock::now() + options_.io_timeout);
    if (Stopping()) break;
    if (!HeartbeatIfDue(Clock::now() + options_.io_timeout).ok()) continue;
    if (Stopping()) break;
    if (republish_pending_ && !RunRepublish().ok()) continue;
    if (Stopping()) break;
    const bool refresh_requested = [&] {
      MutexLock lock(&queue_mu_);
      return refresh_target > refresh_served_;
    }();
    if (Clock::now() >= next_refresh || refresh_requested) {
      next_refresh = Clock::now() + options_.live_refresh_period;
      Result<std::map<std::string, DirectoryNode>> live =
          FetchLiveNodes(*writer_connection_,
                         Clock::now() + options_.io_timeout, /*prune=*/true);
      if (!live.ok()) {
        FinishRefresh(refresh_target, /*ok=*/false);
        if (writer_connection_->broken()) {
          WriterFailed(writer_connection_->timed_out());
        }
        continue;
      }
      InstallLiveNodes(std::move(*live));
      FinishRefresh(refresh_target, /*ok=*/true);
    }
    if (Stopping()) break;
    if (!batch.empty()) {
      TIERKV_SYNC_POINT(kBeforeWriteBatch);
      // kept on failure; retried on reconnect
      if (!WriteOps(batch, Clock::now() + options_.io_timeout).ok()) continue;
      bool drained = false;
      {
        MutexLock lock(&queue_mu_);
        done_ops_ += batch.size();
        in_flight_ops_ = 0;
        flushed_cv_.SignalAll();
        drained = queue_.empty();
      }
      batch.clear();
      // Dropped publishes left holes in the directory: once the backlog
      // is written, fill them by re-publishing the catalog.
      if (drained && options_.republish &&
          publishes_dropped_.exchange(false, std::memory_order_relaxed)) {
        republish_pending_ = true;
      }
    }
  }
  DrainAndDeregister(std::move(batch));
}

void RedisDirectory::DrainAndDeregister(std::vector<PendingOp> batch) {
  if (writer_connection_ == nullptr) return;
  // One io_timeout for the whole goodbye.
  const Clock::time_point deadline = Clock::now() + options_.io_timeout;
  if (options_.deregister_on_close) {
    // Once the registration is gone every entry naming this node is
    // filtered out, so the queued writes would be wasted: skip them.
    const std::vector<RedisCommand> commands = {
        {"DEL", node_key_}, {"SREM", nodes_key_, self_.node_id}};
    writer_connection_->Pipeline(commands, deadline)
        .status()
        .PermitUncheckedError();
    return;
  }
  // Staying registered until the TTL: write what is queued, best effort.
  for (;;) {
    if (!batch.empty()) {
      if (Clock::now() >= deadline || !WriteOps(batch, deadline).ok()) return;
      batch.clear();
    }
    MutexLock lock(&queue_mu_);
    if (queue_.empty()) return;
    const size_t take =
        std::min<size_t>(queue_.size(), options_.write_batch_pages);
    batch.assign(std::make_move_iterator(queue_.begin()),
                 std::make_move_iterator(queue_.begin() + take));
    queue_.erase(queue_.begin(), queue_.begin() + take);
  }
}

void RedisDirectory::RequestLookupConnection() {
  lookup_connection_wanted_.store(true, std::memory_order_release);
  MutexLock lock(&queue_mu_);
  queue_cv_.SignalAll();
}

void RedisDirectory::EnsureLookupConnection(Clock::time_point deadline) {
  if (!lookup_connection_wanted_.load(std::memory_order_acquire)) return;
  if (Clock::now() < lookup_connect_at_) return;
  lookup_connection_wanted_.store(false, std::memory_order_relaxed);
  bool timed_out = false;
  Result<std::unique_ptr<RedisConnection>> made =
      RedisConnection::Connect(url_, password_, deadline, &timed_out);
  if (!made.ok()) {
    // The writer's own round trips tell the breaker about the server; a
    // failed lookup connect only backs off and retries.
    lookup_connect_backoff_ =
        lookup_connect_backoff_.count() == 0
            ? Clock::duration(options_.min_backoff)
            : std::min<Clock::duration>(2 * lookup_connect_backoff_,
                                        options_.max_backoff);
    lookup_connect_at_ = Clock::now() + lookup_connect_backoff_;
    lookup_connection_wanted_.store(true, std::memory_order_relaxed);
    return;
  }
  lookup_connect_backoff_ = Clock::duration(0);
  std::unique_ptr<RedisConnection> spare = std::move(*made);
  {
    MutexLock lock(&mu_);
    if (lookup_connection_ == nullptr && !lookup_busy_) {
      lookup_connection_ = std::move(spare);
      if (lookup_connected_once_) {
        reconnects_.fetch_add(1, std::memory_order_relaxed);
      }
      lookup_connected_once_ = true;
      lookup_cv_.SignalAll();
    }
  }
  // `spare`, if still set, is closed here, outside the lock.
}

// ---------------------------------------------------------------------------
// Live set.

Result<std::map<std::string, DirectoryNode>> RedisDirectory::FetchLiveNodes(
    RedisConnection& connection, Clock::time_point deadline, bool prune) {
  Result<RedisReply> members =
      connection.Command({"SMEMBERS", nodes_key_}, deadline);
  if (!members.ok()) return members.status();
  if (members->is_error()) {
    return ReplyError("directory refused the node list", *members);
  }
  std::vector<std::string> ids;
  for (const RedisReply& member : members->elements) {
    if (IsValidId(member.str)) ids.push_back(member.str);
  }
  std::vector<RedisCommand> commands;
  commands.reserve(ids.size());
  for (const std::string& id : ids) {
    commands.push_back({"HMGET", prefix_ + "node:" + id, "addr", "epoch"});
  }
  Result<std::vector<RedisReply>> replies =
      connection.Pipeline(commands, deadline);
  if (!replies.ok()) return replies.status();
  std::map<std::string, DirectoryNode> live;
  RedisCommand prune_command = {"SREM", nodes_key_};
  for (size_t i = 0; i < ids.size(); ++i) {
    const RedisReply& fields = (*replies)[i];
    if (fields.type != RedisReply::Type::kArray ||
        fields.elements.size() != 2 ||
        fields.elements[1].type != RedisReply::Type::kString) {
      prune_command.push_back(ids[i]);  // expired (or not ours): not live
      continue;
    }
    DirectoryNode node;
    node.node_id = ids[i];
    node.address = fields.elements[0].str;
    const std::string& epoch = fields.elements[1].str;
    (void)std::from_chars(epoch.data(), epoch.data() + epoch.size(),
                          node.epoch);
    live.emplace(ids[i], std::move(node));
  }
  if (prune && prune_command.size() > 2) {
    // A node that re-registers meanwhile re-adds itself on its next
    // heartbeat; until then it only misses being looked up.
    Result<RedisReply> pruned = connection.Command(prune_command, deadline);
    if (!pruned.ok()) return pruned.status();
  }
  live_refreshes_.fetch_add(1, std::memory_order_relaxed);
  return live;
}

void RedisDirectory::InstallLiveNodes(
    std::map<std::string, DirectoryNode> live) {
  auto snapshot = std::make_shared<const std::map<std::string, DirectoryNode>>(
      std::move(live));
  MutexLock lock(&mu_);
  live_.swap(snapshot);
  // The old snapshot, if last, is freed here after the lock is released.
}

void RedisDirectory::FinishRefresh(uint64_t served, bool ok) {
  MutexLock lock(&queue_mu_);
  if (served <= refresh_served_) return;
  refresh_served_ = served;
  last_refresh_ok_ = ok;
  refreshed_cv_.SignalAll();
}

std::vector<DirectoryNode> RedisDirectory::LiveNodes() const {
  std::shared_ptr<const std::map<std::string, DirectoryNode>> live;
  {
    MutexLock lock(&mu_);
    live = live_;
  }
  std::vector<DirectoryNode> nodes;
  nodes.reserve(live->size());
  for (const auto& [id, node] : *live) nodes.push_back(node);
  return nodes;
}

Status RedisDirectory::RefreshLiveNodes(Clock::time_point deadline) {
  deadline = std::min(deadline, Clock::now() + 2 * options_.io_timeout);
  MutexLock lock(&queue_mu_);
  if (stopping_) return Status::Shutdown("directory is closing");
  const uint64_t target = ++refresh_requests_;
  queue_cv_.SignalAll();
  while (refresh_served_ < target) {
    if (stopping_) return Status::Shutdown("directory is closing");
    if (!refreshed_cv_.WaitUntil(&queue_mu_, deadline) &&
        refresh_served_ < target) {
      return Status::Unavailable(
          "directory live set not reloaded by the deadline");
    }
  }
  if (!last_refresh_ok_) {
    return Status::Unavailable("directory live set reload failed");
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Lookup path and circuit breaker.

void RedisDirectory::RecordSuccessLocked() {
  up_ = true;
  backoff_ = Clock::duration(0);
  retry_at_ = Clock::time_point{};
}

void RedisDirectory::RecordWriterSuccessLocked(Clock::time_point now) {
  up_ = true;
  // Not a full reset: the writer's round trips have a looser timeout than
  // a lookup's budget, so a server too slow for lookups may still serve
  // them. Probing again within min_backoff recovers lookups quickly after
  // an outage, and costs a slow server at most one budget per min_backoff.
  retry_at_ = std::min(retry_at_, now + Clock::duration(options_.min_backoff));
}

void RedisDirectory::RecordFailureLocked(Clock::time_point now) {
  up_ = false;
  backoff_ = backoff_.count() == 0 ? Clock::duration(options_.min_backoff)
                                   : std::min<Clock::duration>(
                                         2 * backoff_, options_.max_backoff);
  retry_at_ = now + backoff_;
}

Status RedisDirectory::WithLookupConnection(
    Clock::time_point deadline,
    const std::function<Status(RedisConnection&, bool* server_failed)>& body) {
  std::unique_ptr<RedisConnection> connection;
  {
    MutexLock lock(&mu_);
    for (;;) {
      const Clock::time_point now = Clock::now();
      if (now < retry_at_) {
        lookups_short_circuited_.fetch_add(1, std::memory_order_relaxed);
        return Status::Unavailable("directory down; next try in " +
                                   Millis(retry_at_ - now) + " ms");
      }
      // The caller's own deadline says nothing about the server: answer
      // without a trip and without feeding the breaker.
      if (now >= deadline) {
        return Status::Unavailable(
            "directory lookup deadline passed before a round trip");
      }
      if (!lookup_busy_) break;
      TIERKV_SYNC_POINT(kWaitingForLookupConnection);
      if (!lookup_cv_.WaitUntil(&mu_, deadline) && lookup_busy_) {
        return Status::Unavailable(
            "directory lookup connection busy until the deadline");
      }
    }
    if (lookup_connection_ == nullptr) {
      lookups_without_connection_.fetch_add(1, std::memory_order_relaxed);
      return Status::Unavailable(
          "no directory lookup connection ready (connecting in the "
          "background)");
    }
    lookup_busy_ = true;
    connection = std::move(lookup_connection_);
  }

  bool server_failed = false;
  const Status status = body(*connection, &server_failed);
  const bool lost = connection->broken();
  {
    MutexLock lock(&mu_);
    if (!lost) lookup_connection_ = std::move(connection);
    lookup_busy_ = false;
    // All waiters: one that wakes may leave without the connection (breaker
    // open, deadline passed, none ready) and must not strand the others.
    lookup_cv_.SignalAll();
    if (status.ok()) {
      RecordSuccessLocked();
    } else if (server_failed) {
      RecordFailureLocked(Clock::now());
    }
  }
  if (lost) {
    connection.reset();
    RequestLookupConnection();
  }
  return status;
}

Result<std::vector<PageHolders>> RedisDirectory::Lookup(
    const DirectoryNamespace& ns, std::span<const PageHash> pages,
    Clock::time_point deadline) {
  TIERKV_RETURN_IF_ERROR(ns.Validate());
  const Clock::time_point start = Clock::now();
  deadline = std::min(deadline, start + options_.lookup_budget);
  std::vector<PageHolders> holders;
  if (pages.empty()) return holders;
  if (Stopping()) return Status::Shutdown("directory is closing");
  const std::string prefix = PageKeyPrefix(ns);
  std::shared_ptr<const std::map<std::string, DirectoryNode>> live;
  {
    MutexLock lock(&mu_);
    live = live_;
  }
  bool reached = false;
  const Status status = WithLookupConnection(
      deadline, [&](RedisConnection& connection, bool* server_failed) {
        reached = true;
        holders.clear();
        // Whether a timeout of the first trip is the server's fault: only
        // when the trip had (about) the whole budget, not a caller's short
        // deadline or what a wait for the connection left.
        const bool full_budget =
            deadline - Clock::now() >= options_.lookup_budget / 2;
        Clock::duration last_trip{0};
        RedisCommand mget;
        std::vector<std::string_view> ids;
        for (size_t begin = 0; begin < pages.size();
             begin += options_.lookup_batch_pages) {
          // Not a trip that would likely run out of budget midway (and
          // cost the connection): return the prefix found so far.
          if (begin > 0 && deadline - Clock::now() < 2 * last_trip) {
            return Status::OK();
          }
          const size_t end =
              std::min(pages.size(), begin + options_.lookup_batch_pages);
          mget = {"MGET"};
          mget.reserve(1 + end - begin);
          for (size_t i = begin; i < end; ++i) {
            mget.push_back(prefix + pages[i].ToHex());
          }
          TIERKV_SYNC_POINT(kBeforeLookupTrip);
          const Clock::time_point trip_start = Clock::now();
          Result<RedisReply> values = connection.Command(mget, deadline);
          if (!values.ok()) {
            const bool timed_out =
                !connection.broken() || connection.timed_out();
            // A later trip out of time: the earlier trips' answers stand.
            if (timed_out && begin > 0) return Status::OK();
            *server_failed =
                timed_out ? full_budget && connection.broken() : true;
            return values.status();
          }
          last_trip = Clock::now() - trip_start;
          // A refusal (NOPERM) answers no page: the prefix ends here.
          if (values->type != RedisReply::Type::kArray ||
              values->elements.size() != end - begin) {
            return Status::OK();
          }
          for (const RedisReply& value : values->elements) {
            PageHolders page;
            // Nil (no entry, or one of another type): no holder.
            if (value.type == RedisReply::Type::kString) {
              ids.clear();
              if (!SplitHolderList(value.str, &ids)) {
                lookup_malformed_pages_.fetch_add(1, std::memory_order_relaxed);
                return Status::OK();  // prefix ends
              }
              for (const std::string_view id : ids) {
                std::string node_id(id);
                if (node_id != self_.node_id && live->contains(node_id)) {
                  page.node_ids.push_back(std::move(node_id));
                }
              }
            }
            if (page.node_ids.empty()) return Status::OK();  // prefix ends
            std::sort(page.node_ids.begin(), page.node_ids.end());
            page.node_ids.erase(
                std::unique(page.node_ids.begin(), page.node_ids.end()),
                page.node_ids.end());
            holders.push_back(std::move(page));
          }
        }
        return Status::OK();
      });
  const auto latency = std::chrono::duration_cast<std::chrono::microseconds>(
      Clock::now() - start);
  if (reached) {
    lookups_.fetch_add(1, std::memory_order_relaxed);
    lookup_pages_.fetch_add(pages.size(), std::memory_order_relaxed);
    MutexLock lock(&mu_);
    last_lookup_latency_ = latency;
  }
  if (!status.ok()) {
    if (reached) lookup_errors_.fetch_add(1, std::memory_order_relaxed);
    return status;
  }
  lookup_hit_pages_.fetch_add(holders.size(), std::memory_order_relaxed);
  return holders;
}

DirectoryStats RedisDirectory::GetStats() const {
  DirectoryStats stats;
  {
    MutexLock lock(&mu_);
    stats.up = up_;
    stats.live_nodes = live_->size();
    stats.last_lookup_latency = last_lookup_latency_;
  }
  {
    MutexLock lock(&queue_mu_);
    stats.queued_pages = queue_.size() + in_flight_ops_;
  }
  const auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  stats.lookups = load(lookups_);
  stats.lookup_pages = load(lookup_pages_);
  stats.lookup_hit_pages = load(lookup_hit_pages_);
  stats.lookup_malformed_pages = load(lookup_malformed_pages_);
  stats.lookup_errors = load(lookup_errors_);
  stats.lookups_short_circuited = load(lookups_short_circuited_);
  stats.lookups_without_connection = load(lookups_without_connection_);
  stats.published_pages = load(published_pages_);
  stats.unpublished_pages = load(unpublished_pages_);
  stats.forgotten_holders = load(forgotten_holders_);
  stats.dropped_pages = load(dropped_pages_);
  stats.write_errors = load(write_errors_);
  stats.heartbeats = load(heartbeats_);
  stats.heartbeat_errors = load(heartbeat_errors_);
  stats.live_refreshes = load(live_refreshes_);
  stats.reconnects = load(reconnects_);
  stats.republishes = load(republishes_);
  return stats;
}

}  // namespace tierkv::transport
