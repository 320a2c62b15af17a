/** One thing a test command needs from the system (scripts/setup-system.js's table). */
export interface Requirement {
  readonly name: string;
  readonly package: string;
  readonly for: readonly ('test' | 'valgrind' | 'runtimes')[];
  readonly why: string;
  readonly program?: string;
  readonly sbin?: boolean;
  readonly file?: string;
  check?(): string | undefined;
  when?(): boolean;
}
export const REQUIREMENTS: readonly Requirement[];
/** The requirements of these commands that are missing here. */
export function missing(scopes: readonly string[]): Requirement[];
/** The command that installs these Debian packages. */
export function installCommand(packages: readonly string[]): string;
