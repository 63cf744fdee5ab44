// Lock contracts the compiler checks: Clang's thread-safety analysis (-Wthread-safety, on in
// clang builds, meson.build). Each macro is one of Clang's attributes; other compilers see
// nothing. A capability is a lock; a function states which it needs (REQUIRES), takes
// (ACQUIRE, TRY_ACQUIRE), gives back (RELEASE) or must be called without (EXCLUDES), and a
// field which lock guards it (GUARDED_BY). The analysis is per function and follows no
// pointer or Result, so a lock handed back inside a Result is stated with
// ASSERT_CAPABILITY at the call site.
#pragma once

#if defined(__clang__)
#define SPOOL_THREAD_ATTR(x) __attribute__((x))
#else
#define SPOOL_THREAD_ATTR(x)
#endif

// A type that is a lock; `name` appears in the diagnostics ("mutex", "index lock").
#define CAPABILITY(name) SPOOL_THREAD_ATTR(capability(name))
// An RAII type that holds the capabilities its constructor takes until it is destroyed.
#define SCOPED_CAPABILITY SPOOL_THREAD_ATTR(scoped_lockable)
// Read or written only with the lock held.
#define GUARDED_BY(lock) SPOOL_THREAD_ATTR(guarded_by(lock))
// The data the pointer points to is read or written only with the lock held.
#define PT_GUARDED_BY(lock) SPOOL_THREAD_ATTR(pt_guarded_by(lock))
// Called with the locks held (exclusively); they are still held on return.
#define REQUIRES(...) SPOOL_THREAD_ATTR(requires_capability(__VA_ARGS__))
// Takes the locks (without arguments in a lock type: the object itself).
#define ACQUIRE(...) SPOOL_THREAD_ATTR(acquire_capability(__VA_ARGS__))
// Gives the locks back.
#define RELEASE(...) SPOOL_THREAD_ATTR(release_capability(__VA_ARGS__))
// Takes the locks when it returns `ok` (true, or a non-null pointer).
#define TRY_ACQUIRE(...) SPOOL_THREAD_ATTR(try_acquire_capability(__VA_ARGS__))
// Called without the locks (it takes them itself).
#define EXCLUDES(...) SPOOL_THREAD_ATTR(locks_excluded(__VA_ARGS__))
// Returns only if the locks are held; from then on the analysis takes them as held.
#define ASSERT_CAPABILITY(...) SPOOL_THREAD_ATTR(assert_capability(__VA_ARGS__))
// Returns a reference to the lock named.
#define RETURN_CAPABILITY(lock) SPOOL_THREAD_ATTR(lock_returned(lock))
// The function is not checked. Each use says why the analysis cannot follow it.
#define NO_THREAD_SAFETY_ANALYSIS SPOOL_THREAD_ATTR(no_thread_safety_analysis)
