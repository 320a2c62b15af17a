// A libstdc++.so.6 for musl, for the Linux test run only (scripts/test-linux.js): Bun's musl builds
// (@oven/bun-linux-*-musl) are linked against Alpine's GNU libstdc++, which Debian does not ship for
// musl, and the glibc one cannot load under musl. Built with zig for x86_64-linux-musl and
// aarch64-linux-musl, it holds what Bun takes from that library and nothing else:
//
// - the C++ ABI runtime (__dynamic_cast, __cxa_guard_*, __cxa_demangle, the __cxxabiv1 type_info
//   vtables): LLVM's libc++abi, compiled into this library from the
//   sources zig ships (test-linux.js lists the files), with default visibility so that they are
//   exported; the Itanium C++ ABI is the same for both libraries;
// - the few libstdc++-only symbols Bun's inlined libstdc++ headers call, defined below with
//   libstdc++'s layouts: the red-black tree of std::map and std::set, std::list's node links,
//   std::unordered_map's rehash policy and hash, std::condition_variable, std::call_once's
//   thread-local slots, steady_clock::now, std::terminate and its handler, and the __throw_* helpers (which report and abort: Bun
//   is built without exceptions, so nothing could catch them).
//
// test-linux.js checks that Bun resolves every symbol it needs from musl and this library.

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

[[noreturn]] static void fail(const char *what, const char *detail) {
  fprintf(stderr, "libstdc++ (musl test build): %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  abort();
}

namespace std {

// ---- std::terminate and the handlers Bun asks for ----
typedef void (*terminate_handler)();
typedef void (*new_handler)();
static terminate_handler the_terminate_handler = nullptr;
EXPORT terminate_handler set_terminate(terminate_handler handler) throw() {
  return __atomic_exchange_n(&the_terminate_handler, handler, __ATOMIC_ACQ_REL);
}
[[noreturn]] EXPORT void terminate() throw() {
  terminate_handler handler = __atomic_load_n(&the_terminate_handler, __ATOMIC_ACQUIRE);
  if (handler != nullptr) handler();
  fail("std::terminate", nullptr);
}
// Nothing Bun links can set one (it takes no std::set_new_handler from this library).
EXPORT new_handler get_new_handler() throw() { return nullptr; }

// ---- the __throw_* helpers: libstdc++ throws; here they report and abort ----
[[noreturn]] EXPORT void __throw_bad_alloc() { fail("std::bad_alloc", nullptr); }
[[noreturn]] EXPORT void __throw_logic_error(const char *s) { fail("std::logic_error", s); }
[[noreturn]] EXPORT void __throw_length_error(const char *s) { fail("std::length_error", s); }
[[noreturn]] EXPORT void __throw_system_error(int e) { fail("std::system_error", strerror(e)); }
[[noreturn]] EXPORT void __throw_bad_function_call() { fail("std::bad_function_call", nullptr); }
[[noreturn]] EXPORT void __throw_bad_array_new_length() { fail("std::bad_array_new_length", nullptr); }
[[noreturn]] EXPORT void __throw_out_of_range_fmt(const char *fmt, ...) {
  char text[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  fail("std::out_of_range", text);
}
[[noreturn]] EXPORT void __glibcxx_assert_fail(const char *file, int line, const char *function, const char *condition) {
  fprintf(stderr, "%s:%d: %s: assertion '%s' failed.\n", file, line, function, condition);
  abort();
}

// ---- std::_Rb_tree (std::map, std::set): libstdc++'s node layout and header convention ----
// The header node: parent is the root, left the leftmost node, right the rightmost, its colour red.
enum _Rb_tree_color { _S_red = false, _S_black = true };
struct _Rb_tree_node_base {
  _Rb_tree_color _M_color;
  _Rb_tree_node_base *_M_parent;
  _Rb_tree_node_base *_M_left;
  _Rb_tree_node_base *_M_right;
};
typedef _Rb_tree_node_base Node;

EXPORT Node *_Rb_tree_increment(Node *x) throw() {
  if (x->_M_right != nullptr) {
    x = x->_M_right;
    while (x->_M_left != nullptr) x = x->_M_left;
  } else {
    Node *y = x->_M_parent;
    while (x == y->_M_right) {
      x = y;
      y = y->_M_parent;
    }
    // x is the header when the tree has one node and we came from the root.
    if (x->_M_right != y) x = y;
  }
  return x;
}

EXPORT Node *_Rb_tree_decrement(Node *x) throw() {
  if (x->_M_color == _S_red && x->_M_parent->_M_parent == x) {
    x = x->_M_right;  // the header: end() - 1 is the rightmost node
  } else if (x->_M_left != nullptr) {
    Node *y = x->_M_left;
    while (y->_M_right != nullptr) y = y->_M_right;
    x = y;
  } else {
    Node *y = x->_M_parent;
    while (x == y->_M_left) {
      x = y;
      y = y->_M_parent;
    }
    x = y;
  }
  return x;
}

static void rotate_left(Node *x, Node *&root) {
  Node *y = x->_M_right;
  x->_M_right = y->_M_left;
  if (y->_M_left != nullptr) y->_M_left->_M_parent = x;
  y->_M_parent = x->_M_parent;
  if (x == root)
    root = y;
  else if (x == x->_M_parent->_M_left)
    x->_M_parent->_M_left = y;
  else
    x->_M_parent->_M_right = y;
  y->_M_left = x;
  x->_M_parent = y;
}

static void rotate_right(Node *x, Node *&root) {
  Node *y = x->_M_left;
  x->_M_left = y->_M_right;
  if (y->_M_right != nullptr) y->_M_right->_M_parent = x;
  y->_M_parent = x->_M_parent;
  if (x == root)
    root = y;
  else if (x == x->_M_parent->_M_right)
    x->_M_parent->_M_right = y;
  else
    x->_M_parent->_M_left = y;
  y->_M_right = x;
  x->_M_parent = y;
}

static const Node *minimum(const Node *x) {
  while (x->_M_left != nullptr) x = x->_M_left;
  return x;
}

static const Node *maximum(const Node *x) {
  while (x->_M_right != nullptr) x = x->_M_right;
  return x;
}

EXPORT void _Rb_tree_insert_and_rebalance(const bool insert_left, Node *x, Node *p, Node &header) throw() {
  Node *&root = header._M_parent;
  x->_M_parent = p;
  x->_M_left = nullptr;
  x->_M_right = nullptr;
  x->_M_color = _S_red;
  if (insert_left) {
    p->_M_left = x;  // also makes leftmost = x when p is the header
    if (p == &header) {
      header._M_parent = x;
      header._M_right = x;
    } else if (p == header._M_left) {
      header._M_left = x;
    }
  } else {
    p->_M_right = x;
    if (p == header._M_right) header._M_right = x;
  }
  while (x != root && x->_M_parent->_M_color == _S_red) {
    Node *const xpp = x->_M_parent->_M_parent;
    if (x->_M_parent == xpp->_M_left) {
      Node *const y = xpp->_M_right;
      if (y != nullptr && y->_M_color == _S_red) {
        x->_M_parent->_M_color = _S_black;
        y->_M_color = _S_black;
        xpp->_M_color = _S_red;
        x = xpp;
      } else {
        if (x == x->_M_parent->_M_right) {
          x = x->_M_parent;
          rotate_left(x, root);
        }
        x->_M_parent->_M_color = _S_black;
        xpp->_M_color = _S_red;
        rotate_right(xpp, root);
      }
    } else {
      Node *const y = xpp->_M_left;
      if (y != nullptr && y->_M_color == _S_red) {
        x->_M_parent->_M_color = _S_black;
        y->_M_color = _S_black;
        xpp->_M_color = _S_red;
        x = xpp;
      } else {
        if (x == x->_M_parent->_M_left) {
          x = x->_M_parent;
          rotate_right(x, root);
        }
        x->_M_parent->_M_color = _S_black;
        xpp->_M_color = _S_red;
        rotate_left(xpp, root);
      }
    }
  }
  root->_M_color = _S_black;
}

EXPORT Node *_Rb_tree_rebalance_for_erase(Node *const z, Node &header) throw() {
  Node *&root = header._M_parent;
  Node *&leftmost = header._M_left;
  Node *&rightmost = header._M_right;
  Node *y = z;
  Node *x = nullptr;
  Node *x_parent = nullptr;

  if (y->_M_left == nullptr) {
    x = y->_M_right;
  } else if (y->_M_right == nullptr) {
    x = y->_M_left;
  } else {
    y = y->_M_right;  // z has two children: y is its successor, which has no left child
    while (y->_M_left != nullptr) y = y->_M_left;
    x = y->_M_right;
  }
  if (y != z) {
    // y takes z's place.
    z->_M_left->_M_parent = y;
    y->_M_left = z->_M_left;
    if (y != z->_M_right) {
      x_parent = y->_M_parent;
      if (x) x->_M_parent = y->_M_parent;
      y->_M_parent->_M_left = x;
      y->_M_right = z->_M_right;
      z->_M_right->_M_parent = y;
    } else {
      x_parent = y;
    }
    if (root == z)
      root = y;
    else if (z->_M_parent->_M_left == z)
      z->_M_parent->_M_left = y;
    else
      z->_M_parent->_M_right = y;
    y->_M_parent = z->_M_parent;
    _Rb_tree_color c = y->_M_color;
    y->_M_color = z->_M_color;
    z->_M_color = c;
    y = z;  // the node actually taken out of the tree
  } else {
    x_parent = y->_M_parent;
    if (x) x->_M_parent = y->_M_parent;
    if (root == z)
      root = x;
    else if (z->_M_parent->_M_left == z)
      z->_M_parent->_M_left = x;
    else
      z->_M_parent->_M_right = x;
    if (leftmost == z) {
      if (z->_M_right == nullptr)  // z->_M_left is null too
        leftmost = z->_M_parent;
      else
        leftmost = const_cast<Node *>(minimum(x));
    }
    if (rightmost == z) {
      if (z->_M_left == nullptr)  // z->_M_right is null too
        rightmost = z->_M_parent;
      else
        rightmost = const_cast<Node *>(maximum(x));
    }
  }
  if (y->_M_color != _S_red) {
    while (x != root && (x == nullptr || x->_M_color == _S_black)) {
      if (x == x_parent->_M_left) {
        Node *w = x_parent->_M_right;
        if (w->_M_color == _S_red) {
          w->_M_color = _S_black;
          x_parent->_M_color = _S_red;
          rotate_left(x_parent, root);
          w = x_parent->_M_right;
        }
        if ((w->_M_left == nullptr || w->_M_left->_M_color == _S_black) &&
            (w->_M_right == nullptr || w->_M_right->_M_color == _S_black)) {
          w->_M_color = _S_red;
          x = x_parent;
          x_parent = x_parent->_M_parent;
        } else {
          if (w->_M_right == nullptr || w->_M_right->_M_color == _S_black) {
            w->_M_left->_M_color = _S_black;
            w->_M_color = _S_red;
            rotate_right(w, root);
            w = x_parent->_M_right;
          }
          w->_M_color = x_parent->_M_color;
          x_parent->_M_color = _S_black;
          if (w->_M_right) w->_M_right->_M_color = _S_black;
          rotate_left(x_parent, root);
          break;
        }
      } else {
        Node *w = x_parent->_M_left;
        if (w->_M_color == _S_red) {
          w->_M_color = _S_black;
          x_parent->_M_color = _S_red;
          rotate_right(x_parent, root);
          w = x_parent->_M_left;
        }
        if ((w->_M_right == nullptr || w->_M_right->_M_color == _S_black) &&
            (w->_M_left == nullptr || w->_M_left->_M_color == _S_black)) {
          w->_M_color = _S_red;
          x = x_parent;
          x_parent = x_parent->_M_parent;
        } else {
          if (w->_M_left == nullptr || w->_M_left->_M_color == _S_black) {
            w->_M_right->_M_color = _S_black;
            w->_M_color = _S_red;
            rotate_left(w, root);
            w = x_parent->_M_left;
          }
          w->_M_color = x_parent->_M_color;
          x_parent->_M_color = _S_black;
          if (w->_M_left) w->_M_left->_M_color = _S_black;
          rotate_right(x_parent, root);
          break;
        }
      }
    }
    if (x) x->_M_color = _S_black;
  }
  return y;
}

// ---- std::list's node links ----
namespace __detail {
struct _List_node_base {
  _List_node_base *_M_next;
  _List_node_base *_M_prev;
  EXPORT void _M_hook(_List_node_base *position) throw();
  EXPORT void _M_unhook() throw();
};
void _List_node_base::_M_hook(_List_node_base *position) throw() {
  _M_next = position;
  _M_prev = position->_M_prev;
  position->_M_prev->_M_next = this;
  position->_M_prev = this;
}
void _List_node_base::_M_unhook() throw() {
  _List_node_base *const next = _M_next;
  _List_node_base *const prev = _M_prev;
  prev->_M_next = next;
  next->_M_prev = prev;
}

// ---- std::unordered_map's bucket counts: the next prime, grown by a factor of two ----
struct _RehashAnswer {
  bool rehash;
  size_t buckets;
};
struct _Prime_rehash_policy {
  float _M_max_load_factor;
  mutable size_t _M_next_resize;
  EXPORT size_t _M_next_bkt(size_t n) const;
  EXPORT _RehashAnswer _M_need_rehash(size_t n_bkt, size_t n_elt, size_t n_ins) const;
};

static bool is_prime(size_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (size_t d = 3; d <= n / d; d += 2)
    if (n % d == 0) return false;
  return true;
}

size_t _Prime_rehash_policy::_M_next_bkt(size_t n) const {
  size_t prime = n == 0 ? 1 : n;
  if (prime > 1)
    while (!is_prime(prime)) prime++;
  else if (n == 1)
    prime = 2;
  const double resize = static_cast<double>(prime) * _M_max_load_factor;
  _M_next_resize = resize >= static_cast<double>(SIZE_MAX) ? SIZE_MAX : static_cast<size_t>(resize);
  return prime;
}

_RehashAnswer _Prime_rehash_policy::_M_need_rehash(size_t n_bkt, size_t n_elt, size_t n_ins) const {
  if (n_elt + n_ins > _M_next_resize) {
    const double min_bkts = static_cast<double>(n_elt + n_ins) / _M_max_load_factor;
    if (min_bkts >= static_cast<double>(n_bkt)) {
      const size_t grown = static_cast<size_t>(min_bkts) + 1;
      return {true, _M_next_bkt(grown > n_bkt * 2 ? grown : n_bkt * 2)};
    }
    _M_next_resize = static_cast<size_t>(static_cast<double>(n_bkt) * _M_max_load_factor);
  }
  return {false, 0};
}
}  // namespace __detail

// ---- std::hash of strings: 64-bit FNV-1a over the bytes, mixed with the seed ----
EXPORT size_t _Hash_bytes(const void *ptr, size_t len, size_t seed) {
  const unsigned char *p = static_cast<const unsigned char *>(ptr);
  uint64_t h = 14695981039346656037ull ^ seed;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
  return static_cast<size_t>(h);
}

// ---- std::condition_variable: libstdc++ keeps a pthread_cond_t, and std::mutex a pthread_mutex_t ----
struct mutex {
  pthread_mutex_t m;
};
template <class M>
struct unique_lock {
  M *_M_device;
  bool _M_owns;
};
class condition_variable {
  pthread_cond_t _M_cond;

 public:
  EXPORT condition_variable() throw();
  EXPORT ~condition_variable() throw();
  EXPORT void notify_one() throw();
  EXPORT void notify_all() throw();
  EXPORT void wait(unique_lock<mutex> &lock);
};
condition_variable::condition_variable() throw() { pthread_cond_init(&_M_cond, nullptr); }
condition_variable::~condition_variable() throw() { pthread_cond_destroy(&_M_cond); }
void condition_variable::notify_one() throw() { pthread_cond_signal(&_M_cond); }
void condition_variable::notify_all() throw() { pthread_cond_broadcast(&_M_cond); }
void condition_variable::wait(unique_lock<mutex> &lock) {
  if (pthread_cond_wait(&_M_cond, &lock._M_device->m) != 0) fail("std::condition_variable::wait", nullptr);
}

// ---- std::chrono::steady_clock (libstdc++'s inline namespace _V2): nanoseconds of CLOCK_MONOTONIC ----
namespace chrono {
inline namespace _V2 {
struct steady_clock {
  struct time_point {
    int64_t ns;
  };
  EXPORT static time_point now() throw();
};
steady_clock::time_point steady_clock::now() throw() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return {static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec};
}
}  // namespace _V2
}  // namespace chrono

// ---- std::call_once: the callable is left in these thread-local slots for pthread_once to run ----
EXPORT __thread void *__once_callable;
EXPORT __thread void (*__once_call)();

}  // namespace std

extern "C" EXPORT void __once_proxy() { std::__once_call(); }

// The deleting destructors of libc++abi's std::bad_cast and std::bad_typeid call it; they are never
// run here (no exception is ever thrown); libstdc++ exports it too.
void operator delete(void *p, size_t) noexcept { free(p); }
