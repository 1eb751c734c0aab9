module tessera.dev/tools/nvidia/mig-parted

go 1.26.8

require github.com/NVIDIA/mig-parted v0.10.0

require (
	github.com/NVIDIA/go-nvlib v0.7.0 // indirect
	github.com/NVIDIA/go-nvml v0.12.4-0 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.5 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/urfave/cli/v2 v2.27.5 // indirect
	github.com/xrash/smetrics v0.0.0-20240521201337-686a1a2994c1 // indirect
	golang.org/x/sys v0.21.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	sigs.k8s.io/yaml v1.4.0 // indirect
)
