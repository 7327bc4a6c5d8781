import { defineConfig } from 'vite';

// The daemon serves index.html at `/` and the files under `/assets/`; `base: './'` keeps
// every reference relative so the page also works behind a path prefix.
export default defineConfig({
  base: './',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    // One small chunk: no preload polyfill needed (and nothing fetched but our own files).
    modulePreload: { polyfill: false },
    target: 'es2022',
  },
});
