// Search on the site opened from the file system (file://): the theme runs its search in a Web Worker, and a
// browser refuses to start a worker from a file:// page. On such a page this script stands in for Worker: the
// worker's script runs in a hidden same-origin iframe (about:blank), and the messages go between the two windows
// as structured clones, as they would to a real worker. Served pages (http:) keep the real Worker.
// mkdocs.yml lists it in extra.polyfills (loaded in <head>, before the theme's bundle creates the worker); its
// name keeps the theme's offline plugin from adding its own shim from a CDN, which a file:// page cannot load.
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.queue = [];
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      this.frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(this.frame);
      const inner = this.frame.contentWindow;
      // What the worker's script calls: postMessage(data) answers the page; importScripts(...) loads scripts.
      inner.postMessage = (data) => this.receive(structuredClone(data));
      inner.importScripts = (...urls) => urls.reduce((done, src) => done.then(() => this.load(src)),
                                                     Promise.resolve());
      this.load(new URL(url, document.baseURI).href).then(
        () => {
          const waiting = this.queue;
          this.queue = null;
          waiting.forEach((data) => this.deliver(data));
        },
        () => this.fail(`the search worker ${url} did not load`));
    }

    load(src) {
      const doc = this.frame.contentWindow.document;
      return new Promise((resolve, reject) => {
        const script = doc.createElement("script");
        script.src = new URL(src, document.baseURI).href;
        script.onload = () => resolve();
        script.onerror = () => reject(new Error(src));
        (doc.head || doc.documentElement).appendChild(script);
      });
    }

    postMessage(data) {
      if (this.queue) this.queue.push(data);
      else this.deliver(data);
    }

    deliver(data) {
      const inner = this.frame.contentWindow;
      inner.dispatchEvent(new inner.MessageEvent("message", { data: inner.structuredClone(data) }));
    }

    receive(data) {
      const event = new MessageEvent("message", { data });
      if (typeof this.onmessage === "function") this.onmessage(event);
      this.dispatchEvent(event);
    }

    fail(message) {
      const event = new ErrorEvent("error", { message });
      if (typeof this.onerror === "function") this.onerror(event);
      this.dispatchEvent(event);
      console.error(message);
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.IFrameWorker = IFrameWorker;
  window.Worker = IFrameWorker;
})();
