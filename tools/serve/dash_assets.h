// The dashboard's page files (tools/serve/dash/), compiled into spool-serve by
// tools/serve/dash/embed.py.
#pragma once

#include <string_view>
#include <vector>

namespace spool::serve {

struct Asset {
  std::string_view name;  // file name, e.g. "app.js"
  std::string_view type;  // its Content-Type
  std::string_view body;
};
const std::vector<Asset>& dash_assets();

}  // namespace spool::serve
