package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

func init() {
	addCommand(func() *cobra.Command {
		return &cobra.Command{
			Use:   "version",
			Short: "Print the version and commit of this binary",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "parity %s (commit %s, %s)\n", version, commit, runtime.Version())
				return err
			},
		}
	})
}
