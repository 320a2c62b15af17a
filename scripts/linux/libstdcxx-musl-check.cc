// A check of libstdcxx-musl.cc's libstdc++ symbols, built with the machine's g++ and run by
// scripts/test-linux.js: this program's own definitions of them (from that file, linked in) take the
// place of libstdc++'s, so that std::set, std::list, std::unordered_map, std::condition_variable and
// std::call_once, compiled from libstdc++'s headers as Bun's are, run on them. Exits 0 when all agree
// with a plain model.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

static int failures = 0;
static void expect(bool ok, const char *what) {
  if (!ok) {
    std::printf("FAIL %s\n", what);
    failures++;
  }
}

// The red-black tree's own rules: the root black, no red node with a red child, every path from a
// node down to a leaf through as many black nodes; and each node's parent link right.
static int blackHeight(const std::_Rb_tree_node_base *n, const std::_Rb_tree_node_base *parent, bool &ok) {
  if (n == nullptr) return 1;
  if (n->_M_parent != parent) ok = false;
  if (n->_M_color == std::_S_red) {
    if ((n->_M_left && n->_M_left->_M_color == std::_S_red) || (n->_M_right && n->_M_right->_M_color == std::_S_red))
      ok = false;
  }
  int left = blackHeight(n->_M_left, n, ok);
  int right = blackHeight(n->_M_right, n, ok);
  if (left != right) ok = false;
  return left + (n->_M_color == std::_S_black ? 1 : 0);
}

int main() {
  std::srand(7);
  std::set<int> set;
  std::vector<int> model;
  bool balanced = true;
  for (int round = 0; round < 100000; round++) {
    int k = std::rand() % 3000;
    if (std::rand() % 3 != 0) {
      if (set.insert(k).second) model.insert(std::lower_bound(model.begin(), model.end(), k), k);
    } else {
      auto it = set.find(k);
      if (it != set.end()) {
        set.erase(it);
        model.erase(std::lower_bound(model.begin(), model.end(), k));
      }
    }
    if (round % 499 == 0) {
      const std::_Rb_tree_node_base *header = set.end()._M_node;
      const std::_Rb_tree_node_base *root = header->_M_parent;
      if (root != nullptr && root->_M_color != std::_S_black) balanced = false;
      blackHeight(root, header, balanced);
      expect(std::equal(set.begin(), set.end(), model.begin(), model.end()), "std::set in order (increment)");
      expect(std::equal(set.rbegin(), set.rend(), model.rbegin(), model.rend()), "std::set in reverse (decrement)");
    }
  }
  expect(balanced, "std::set stays a red-black tree");

  std::list<int> list;
  for (int i = 0; i < 1000; i++) list.push_back(i);
  for (auto it = list.begin(); it != list.end();) it = (*it % 3 != 0) ? list.erase(it) : std::next(it);
  expect(list.size() == 334 && list.front() == 0 && list.back() == 999, "std::list hook and unhook");

  std::unordered_map<std::string, int> map;
  for (int i = 0; i < 50000; i++) map[std::to_string(i)] = i;
  bool found = map.size() == 50000;
  for (int i = 0; i < 50000; i++) found = found && map.at(std::to_string(i)) == i;
  expect(found && map.load_factor() <= map.max_load_factor(), "std::unordered_map rehashes and finds every key");

  std::mutex mutex;
  std::condition_variable ready;
  std::once_flag once;
  int onces = 0, woken = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; i++) {
    threads.emplace_back([&] {
      std::call_once(once, [&] { onces++; });
      std::lock_guard<std::mutex> lock(mutex);
      woken++;
      ready.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait(lock, [&] { return woken == 4; });
  }
  for (auto &t : threads) t.join();
  expect(onces == 1, "std::call_once runs once across threads");
  std::printf("%s\n", failures == 0 ? "ok" : "failed");
  return failures == 0 ? 0 : 1;
}
