// Vite configuration for the Suzumio control room (docs/design/webui.md).
// The dev server proxies the API to a local `suzumio serve` on 39400 and strips `Origin`,
// because the page origin (:5173) differs from the backend's and would fail its cross-origin check.
import { fileURLToPath } from 'node:url';
import { defineConfig, type ProxyOptions } from 'vite';
import preact from '@preact/preset-vite';

const backend = 'http://127.0.0.1:39400';

const proxyToBackend: ProxyOptions = {
  target: backend,
  changeOrigin: true,
  configure(proxy) {
    proxy.on('proxyReq', (proxyReq) => {
      proxyReq.removeHeader('origin');
    });
  },
};

export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  plugins: [preact()],
  server: {
    host: '0.0.0.0',
    port: 5173,
    strictPort: true,
    proxy: {
      '/api': proxyToBackend,
      '/health': proxyToBackend,
    },
  },
  build: {
    outDir: '../webui_dist',
    emptyOutDir: true,
    // The server sends `Content-Security-Policy: default-src 'self'`: no data: URLs, no inline code.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
  },
});
