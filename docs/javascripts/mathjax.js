// MathJax 3's configuration, read when it starts (mkdocs.yml's extra_javascript loads this file first).
// pymdownx.arithmatex (generic) wraps each formula of the pages and docstrings in a span or div of class
// "arithmatex", delimited by \( \) or \[ \]: MathJax typesets those and nothing else.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};
