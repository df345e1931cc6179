// Prints the command Claude Desktop would run for a bundle: mcpb's own getMcpConfigForManifest (the code
// Claude Desktop uses) over the bundle's manifest, its folder and the user's settings.
// Usage: node mcpb_config.mjs <mcpb package folder> <manifest.json> <extension folder> <user config JSON>
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, manifestPath, extensionPath, userConfigJson] = process.argv.slice(2);
const { getMcpConfigForManifest } = await import(pathToFileURL(path.join(packageDir, "dist", "index.js")).href);
const config = await getMcpConfigForManifest({
  manifest: JSON.parse(readFileSync(manifestPath, "utf8")),
  extensionPath,
  systemDirs: {},
  userConfig: JSON.parse(userConfigJson),
  pathSeparator: path.sep,
});
process.stdout.write(JSON.stringify(config ?? null));
