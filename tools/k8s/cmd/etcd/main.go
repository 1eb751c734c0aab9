// Command etcd is upstream etcd's server, built from its published module at the pinned version.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
