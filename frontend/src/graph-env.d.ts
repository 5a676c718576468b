/** build.mjs inlines node_modules/elkjs/lib/elk-worker.min.js as text under this name. */
declare module 'elk-worker-source' {
  const source: string;
  export default source;
}
declare module 'elkjs/lib/elk-api.js' {
  const ELK: any;
  export default ELK;
}
