'use strict';
// `npm install`'s build step: node-gyp (the one npm ships) builds src/addon.c against
// libspool found with pkg-config. Node's headers are taken from the installation that runs
// this (Debian's and NodeSource's nodejs put them in <prefix>/include/node), so nothing is
// downloaded; without them node-gyp fetches the headers of this node version as usual.
const { execFileSync } = require('child_process');
const fs = require('fs');
const path = require('path');

try {
  execFileSync('pkg-config', ['--exists', 'spool'], { stdio: 'inherit' });
} catch (e) {
  console.error('spool: pkg-config cannot find libspool (spool.pc): install libspool ' +
    '(meson install, or the Debian package) or set PKG_CONFIG_PATH');
  process.exit(1);
}
const prefix = path.dirname(path.dirname(process.execPath));
const args = ['rebuild'];
if (fs.existsSync(path.join(prefix, 'include', 'node', 'common.gypi'))) args.push('--nodedir=' + prefix);
let gyp = process.env.npm_config_node_gyp;
if (!gyp) {
  // Run outside npm: the node-gyp bundled with npm beside this node.
  gyp = path.join(prefix, 'lib', 'node_modules', 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
}
execFileSync(process.execPath, [gyp, ...args], { stdio: 'inherit', cwd: __dirname });
