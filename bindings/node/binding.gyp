{
  "targets": [{
    "target_name": "spool",
    "sources": ["src/addon.c"],
    "cflags": ["-std=c99", "-Wall", "-Wextra", "-Werror", "<!@(pkg-config --cflags spool)"],
    "libraries": ["<!@(pkg-config --libs spool)"]
  }]
}
