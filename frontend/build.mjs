// Builds the front end into one ES module, nbdebug/ui/static/nbdebug-ui.js (anywidget-style: its default
// export has render({model, el})). ELK's worker source is inlined as text and started from a Blob URL, so
// the whole front end is a single file: the labextension serves it once per page, export_html inlines it.
import { build } from 'esbuild';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const elkWorker = require.resolve('elkjs/lib/elk-worker.min.js');

const inlineElkWorker = {
  name: 'inline-elk-worker',
  setup(b) {
    b.onResolve({ filter: /^elk-worker-source$/ }, () => ({ path: elkWorker, namespace: 'elk-src' }));
    b.onLoad({ filter: /.*/, namespace: 'elk-src' }, args => ({
      contents: readFileSync(args.path, 'utf8'),
      loader: 'text'
    }));
  }
};

await build({
  entryPoints: ['src/index.ts'],
  bundle: true,
  format: 'esm',
  target: 'es2020',
  minify: process.env.NBDEBUG_UI_DEV !== '1',
  sourcemap: false,
  legalComments: 'none',
  outfile: '../nbdebug/ui/static/nbdebug-ui.js',
  plugins: [inlineElkWorker],
  logLevel: 'info'
});
