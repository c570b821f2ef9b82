// Varlink's messages are VarlinkJSON's values: whoever imports Varlink reads and writes them
// without a second import (the Swift client's users name `JSONValue` through `import Varlink`).
@_exported import VarlinkJSON
