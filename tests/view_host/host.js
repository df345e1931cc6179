// The job view's test host: the MCP Apps SDK's own AppBridge in a page on 127.0.0.1, bundled by esbuild at
// test time. The view runs in a sandboxed iframe under the spec's default CSP; its tool calls go to the test
// (window.hostCallTool, a Playwright binding onto the official MCP Python client talking to the bridge).
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

const DEFAULT_CSP = "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; " +
  "img-src 'self' data:; connect-src 'none'";
window.modelContext = [];
window.calls = [];

window.openView = async (html, toolInput, toolResult, serverTools) => {
  const iframe = document.createElement("iframe");
  iframe.id = "view";
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.style.cssText = "width: 760px; height: 640px; border: 1px solid #ccc";
  document.body.append(iframe);
  const capabilities = serverTools ? { serverTools: {}, logging: {} } : { logging: {} };
  const bridge = new AppBridge(null, { name: "claude-hermes-bridge test host", version: "1.0.0" }, capabilities);
  bridge.oncalltool = async (params) => {
    window.calls.push(params.name);
    return await window.hostCallTool(params.name, params.arguments || {});
  };
  bridge.onupdatemodelcontext = async (params) => {
    window.modelContext.push(params);
    return {};
  };
  bridge.oninitialized = () => {
    window.viewInitialized = true;
    bridge.sendToolInput({ arguments: toolInput });
    bridge.sendToolResult(toolResult);
  };
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = html.replace("<head>", `<head><meta http-equiv="Content-Security-Policy" content="${DEFAULT_CSP}">`);
};
