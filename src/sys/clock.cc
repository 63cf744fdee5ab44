#include "sys/clock.h"

#include <fstream>

namespace spool::sys {

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace spool::sys
