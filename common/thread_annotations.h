// Clang thread-safety annotations (STYLE.md habit 10), as in leveldb's
// port/thread_annotations.h. With Clang and -Wthread-safety the compiler
// proves that every GUARDED_BY member is touched only under its mutex and
// that every REQUIRES(mu) helper is called with mu held; with other
// compilers the macros expand to nothing.
#pragma once

#if defined(__clang__)
#define TIERKV_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TIERKV_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) TIERKV_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY TIERKV_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) TIERKV_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) TIERKV_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) \
  TIERKV_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) \
  TIERKV_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) TIERKV_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) TIERKV_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) TIERKV_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TIERKV_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) \
  TIERKV_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) TIERKV_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) TIERKV_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS \
  TIERKV_THREAD_ANNOTATION(no_thread_safety_analysis)
