// Loaded after require.js and before @jupyter-widgets/html-manager's embed-amd.js, on
// pages that embed ipywidgets.
(function () {
  // 1. The widget bundle finds its icon fonts relative to the AMD module
  //    "@jupyter-widgets/html-manager/dist/..."; map that name onto the folder this site
  //    serves it from (_static/html-manager/), whatever the depth of the page.
  var here = new URL(".", document.currentScript.src).href;
  window.require.config({
    paths: { "@jupyter-widgets/html-manager/dist": here + "html-manager" },
  });

  // 2. ipywidgets typesets labels with the MathJax 2 call MathJax.Hub.Queue; the site
  //    loads MathJax 3. Give MathJax 3 a Hub.Queue that runs typesetPromise instead.
  function addHub() {
    if (window.MathJax.Hub) return;
    window.MathJax.Hub = {
      Queue: function () {
        Array.prototype.forEach.call(arguments, function (job) {
          if (Array.isArray(job) && job[0] === "Typeset" && window.MathJax.typesetPromise) {
            var elements = job[2] ? [job[2]] : undefined;
            window.MathJax.startup.promise = window.MathJax.startup.promise.then(function () {
              return window.MathJax.typesetPromise(elements);
            });
          }
        });
      },
    };
  }
  if (!window.MathJax) return; // no math on this page: ipywidgets skips typesetting
  if (window.MathJax.typesetPromise) {
    addHub(); // MathJax 3 already running
  } else {
    // MathJax 3 still to load (deferred): window.MathJax is its configuration.
    var startup = (window.MathJax.startup = window.MathJax.startup || {});
    var ready = startup.ready;
    startup.ready = function () {
      if (ready) ready();
      else window.MathJax.startup.defaultReady();
      addHub();
    };
  }
})();
