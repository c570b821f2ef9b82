import UserStoreCore
import UserStoreInterface
import Varlink

/// What the daemon says about itself.
public enum DaemonInfo {
    /// The daemon's version (``UserStoreVersion/current``).
    public static let version = UserStoreVersion.current

    /// The interface descriptions, verbatim from the `.varlink` files in Sources/UserStoreServer/Interfaces.
    public static let interfaces: [String: String] = [
        "io.userstore.Store": String(decoding: PackageResources.io_userstore_Store_varlink, as: UTF8.self),
        "io.userstore.Admin": String(decoding: PackageResources.io_userstore_Admin_varlink, as: UTF8.self),
        "org.varlink.service": serviceInterface,
    ]

    static let serviceInterface = """
        # The Varlink Service Interface is provided by every varlink service. It
        # describes the service and the interfaces it implements.
        interface org.varlink.service

        # Get a list of all the interfaces a service provides and information
        # about the implementation.
        method GetInfo() -> (
          vendor: string,
          product: string,
          version: string,
          url: string,
          interfaces: []string
        )

        # Get the description of an interface that is implemented by this service.
        method GetInterfaceDescription(interface: string) -> (description: string)

        # The requested interface was not found.
        error InterfaceNotFound (interface: string)

        # The requested method was not found
        error MethodNotFound (method: string)

        # The interface defines the requested method, but the service does not
        # implement it.
        error MethodNotImplemented (method: string)

        # One of the passed parameters is invalid.
        error InvalidParameter (parameter: string)

        # Client is denied access
        error PermissionDenied ()

        # Method is expected to be called with 'more' set to true, but wasn't
        error ExpectedMore ()

        """
}

/// `org.varlink.service`: introspection, open to every connected peer.
struct ServiceMethods {
    func handle(_ method: Method, _ request: Request, send: ReplySink) async throws {
        switch method {
        case .getInfo:
            try await send(VarlinkReply.encode([
                "vendor": "userstore", "product": "userstored", "version": .string(DaemonInfo.version),
                "url": "https://varlink.org",
                "interfaces": ["org.varlink.service", "io.userstore.Store", "io.userstore.Admin"],
            ]))
        case .getInterfaceDescription:
            let name = try request.parameters.string("interface")
            guard let description = DaemonInfo.interfaces[name] else { throw VarlinkError.interfaceNotFound(name) }
            try await send(VarlinkReply.encode(["description": .string(description)]))
        default:
            throw VarlinkError.methodNotFound(request.name)
        }
    }
}
